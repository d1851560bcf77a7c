#!/usr/bin/env python3
# build_paths.py: where a configured build takes its dependencies from, for
# scripts/gpu-check on a machine whose Debian dev packages are unpacked into a
# private prefix. Reads the build's CMakeCache.txt (and compile_commands.json
# and build.ninja when present), classifies every path as prefix / torch /
# cuda / system / project, prints the table, and fails when a library the
# prefix carries was found on the system instead, or an include folder the
# compiler is given does not exist. Standard library only.
#
#   build_paths.py BUILD_DIR --prefix /tmp/dtrain-prefix [--torch-dir DIR]
import argparse
import json
import os
import re
import shlex
import sys

# Names of what the prefix carries (gpu-pack's packages): a path outside the
# prefix that matches one of these means the build used the system's copy.
CARRIED = re.compile(r"grpc|protobuf|protoc|absl|yaml-cpp|spdlog|(^|/)fmt|libfmt|CLI11|/CLI/|nlohmann|doctest|"
                     r"re2|c-ares|cares|libssl|libcrypto|openssl|libz\.|zlib|pkgconf|pkg-config")
# Cache entries named after a carried package (Protobuf_INCLUDE_DIR = /usr/include).
CARRIED_NAME = re.compile(r"grpc|protobuf|absl|yaml|spdlog|^fmt|cli11|nlohmann|doctest|re2|c-ares|"
                          r"openssl|zlib|pkg_config", re.IGNORECASE)


def classify(path, prefix, torch_root, project):
    p = os.path.realpath(path) if os.path.exists(path) else path
    if path.startswith(prefix) or p.startswith(prefix):
        return "prefix"
    if torch_root and (path.startswith(torch_root) or p.startswith(torch_root)):
        return "torch"
    if path.startswith(project) or p.startswith(project):
        return "project"
    if "/cuda" in path:
        return "cuda"
    if path.startswith(("/usr/", "/lib", "/opt/")):
        return "system"
    return "other"


def cache_paths(build):
    """(name, value) of every PATH/FILEPATH/STRING cache entry holding absolute paths."""
    out = []
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(r"^([A-Za-z0-9_.+-]+):(PATH|FILEPATH|STRING|INTERNAL)=(.*)$", line.strip())
            if not m:
                continue
            name, kind, value = m.groups()
            if kind in ("STRING", "INTERNAL") and not re.search(r"_DIR$|pkgcfg_lib_|_INCLUDE_DIRS?$", name):
                continue
            if name.startswith(("CMAKE_", "_")) or "NOTFOUND" in value:
                continue
            for v in value.split(";"):
                if v.startswith("/"):
                    out.append((name, v))
    return out


def include_dirs(build):
    """Unique -I/-isystem folders over every compile command."""
    path = os.path.join(build, "compile_commands.json")
    if not os.path.exists(path):
        return []
    seen = []
    with open(path) as f:
        for entry in json.load(f):
            args = entry.get("arguments") or shlex.split(entry["command"])
            for i, a in enumerate(args):
                d = None
                if a in ("-I", "-isystem") and i + 1 < len(args):
                    d = args[i + 1]
                elif a.startswith("-I") and len(a) > 2:
                    d = a[2:]
                elif a.startswith("-isystem") and len(a) > 8:
                    d = a[8:]
                if d and d not in seen:
                    seen.append(d)
    return seen


def link_libraries(build):
    """Absolute library paths named on the link lines of build.ninja."""
    path = os.path.join(build, "build.ninja")
    if not os.path.exists(path):
        return []
    libs = []
    with open(path) as f:
        for line in f:
            if line.strip().startswith("LINK_LIBRARIES"):
                for tok in shlex.split(line.split("=", 1)[1]):
                    for part in tok.split(","):
                        if part.startswith("/") and (".so" in part or part.endswith(".a")) and part not in libs:
                            libs.append(part)
    return libs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--torch-dir", default="")
    ap.add_argument("--project", default=os.getcwd())
    args = ap.parse_args()
    prefix = os.path.realpath(args.prefix)
    torch_root = ""
    if args.torch_dir:  # .../site-packages/torch/share/cmake/Torch -> .../site-packages
        torch_root = os.path.realpath(os.path.join(args.torch_dir, "..", "..", "..", ".."))
    project = os.path.realpath(args.project)

    problems = []
    print("CMake cache entries that name files or folders:")
    for name, value in cache_paths(args.build):
        where = classify(value, prefix, torch_root, project)
        flag = ""
        if where in ("system", "other") and (CARRIED.search(value) or CARRIED_NAME.search(name)):
            flag = "  <- carried by the prefix, found outside it"
            problems.append(f"{name} = {value}: the system's copy, not the prefix's")
        print(f"  [{where:7}] {name} = {value}{flag}")

    dirs = include_dirs(args.build)
    if dirs:
        print("include folders given to the compiler (-I / -isystem):")
        for d in dirs:
            where = classify(d, prefix, torch_root, project)
            exists = os.path.isdir(d) or where == "project"  # generated folders appear during the build
            print(f"  [{where:7}] {d}{'' if exists else '  <- MISSING'}")
            if not exists:
                problems.append(f"include folder {d} does not exist")
            if where == "system" and CARRIED.search(d):
                problems.append(f"include folder {d} is the system's copy of a carried package")
        print("  (after these the compiler searches its own folders: /usr/include and the GCC ones)")

    libs = link_libraries(args.build)
    if libs:
        print("libraries named on link lines:")
        for lib in libs:
            where = classify(lib, prefix, torch_root, project)
            exists = os.path.exists(lib)
            print(f"  [{where:7}] {lib}{'' if exists else '  <- MISSING'}")
            if not exists and where != "project":
                problems.append(f"link library {lib} does not exist")
            if where == "system" and CARRIED.search(lib):
                problems.append(f"link library {lib} is the system's copy of a carried package")

    for p in problems:
        print(f"problem: {p}")
    print(f"build_paths: {'PASS' if not problems else 'FAIL'}: {len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
