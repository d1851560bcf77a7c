# LibTorch from a PyTorch wheel without Torch's CMake config: the imported
# target `torch` made by hand from the wheel's files. Used where no CUDA
# toolkit is installed: TorchConfig.cmake of a CUDA wheel then stops
# (Caffe2Config.cmake: "uses CUDA but I cannot find the CUDA libraries"),
# although the wheel carries everything the engine needs (it compiles no CUDA
# code): LibTorch's headers and libraries, and under site-packages/nvidia/ the
# CUDA runtime headers and libraries, and nccl.h.
#
# In:  DTRAIN_TORCH_ROOT  the wheel's torch/ folder (holds include/, lib/, share/)
# Out: the target `torch`; TORCH_LIBRARIES, TORCH_CUDA_LIBRARIES (empty for a
#      CPU-only wheel), Torch_VERSION, Torch_DIR, Torch_FOUND, as TorchConfig sets them.

set(_lib "${DTRAIN_TORCH_ROOT}/lib")
foreach(_so torch torch_cpu c10)
  if(NOT EXISTS "${_lib}/lib${_so}.so")
    message(FATAL_ERROR "dtrain: ${_lib}/lib${_so}.so missing: ${DTRAIN_TORCH_ROOT} is not a "
                        "PyTorch wheel's torch/ folder (run scripts/install-deps)")
  endif()
endforeach()

# The version, from the wheel's own version file.
set(PACKAGE_FIND_VERSION ${DTRAIN_TORCH_MIN_VERSION})
include("${DTRAIN_TORCH_ROOT}/share/cmake/Torch/TorchConfigVersion.cmake")
set(Torch_VERSION ${PACKAGE_VERSION})
set(Torch_DIR "${DTRAIN_TORCH_ROOT}/share/cmake/Torch")

set(_includes "${DTRAIN_TORCH_ROOT}/include" "${DTRAIN_TORCH_ROOT}/include/torch/csrc/api/include")
# torch_cpu's usage requirements, as Caffe2Targets.cmake states them.
set(_defs USE_DISTRIBUTED USE_C10D_GLOO USE_RPC USE_TENSORPIPE)
# libtorch.so needs libtorch_cpu.so and (CUDA wheels) libtorch_cuda.so, and
# finds the wheel's nvidia/ libraries through its own $ORIGIN rpath. Linked
# --no-as-needed, as Caffe2Targets does, so that their static registrations
# (operators, the CUDA backend) run even when no symbol is used directly.
set(_links "-Wl,--no-as-needed" "${_lib}/libtorch_cpu.so" "${_lib}/libc10.so")
set(TORCH_CUDA_LIBRARIES "")
if(EXISTS "${_lib}/libtorch_cuda.so")
  # The CUDA runtime headers (c10/cuda includes cuda_runtime_api.h) and
  # library: nvidia/cu13 in CUDA 13 wheels, nvidia/cuda_runtime before.
  get_filename_component(_site "${DTRAIN_TORCH_ROOT}/.." ABSOLUTE)
  file(GLOB _cuda_inc LIST_DIRECTORIES true "${_site}/nvidia/cu[0-9]*/include"
       "${_site}/nvidia/cuda_runtime/include")
  file(GLOB _cudart "${_site}/nvidia/cu[0-9]*/lib/libcudart.so.*"
       "${_site}/nvidia/cuda_runtime/lib/libcudart.so.*")
  # cuda_runtime.h includes crt/host_config.h, from the nvidia-cuda-crt wheel
  # (scripts/install-deps installs it).
  set(_crt "")
  if(_cuda_inc)
    list(GET _cuda_inc 0 _cuda_inc)
    if(EXISTS "${_cuda_inc}/crt/host_config.h")
      set(_crt yes)
    endif()
  endif()
  if(_crt AND _cudart)
    list(GET _cudart 0 _cudart)
    list(APPEND _includes ${_cuda_inc})
    set(TORCH_CUDA_LIBRARIES "${_lib}/libtorch_cuda.so" "${_lib}/libc10_cuda.so" "${_cudart}")
    list(APPEND _links ${TORCH_CUDA_LIBRARIES})
    list(APPEND _defs USE_NVSHMEM USE_C10D_NCCL)  # torch_cuda's, as Caffe2Targets states them
    set(CUDAToolkit_INCLUDE_DIRS ${_cuda_inc})
  else()
    message(STATUS "dtrain: this wheel has CUDA but the CUDA runtime headers beside it "
                   "(nvidia/cu*/include with crt/host_config.h: pip's nvidia-cuda-crt) are "
                   "missing: building the CPU engine only (scripts/install-deps installs them)")
  endif()
endif()
list(APPEND _links "-Wl,--as-needed")

add_library(torch SHARED IMPORTED)
set_target_properties(torch PROPERTIES
  IMPORTED_LOCATION "${_lib}/libtorch.so"
  INTERFACE_INCLUDE_DIRECTORIES "${_includes}"
  INTERFACE_COMPILE_DEFINITIONS "${_defs}"
  INTERFACE_LINK_LIBRARIES "${_links}")
target_compile_features(torch INTERFACE cxx_std_20)
set(TORCH_LIBRARIES torch)
set(Torch_FOUND TRUE)
