// Unit tests: the first host of a SLURM node list (launcher/slurm.h).
#include <doctest/doctest.h>

#include <cstdlib>

#include "launcher/slurm.h"

using dtrain::launcher::SlurmEnv;
using dtrain::launcher::slurm_first_host;

TEST_CASE("slurm_first_host") {
  CHECK(slurm_first_host("node01") == "node01");
  CHECK(slurm_first_host("a,b,c") == "a");
  CHECK(slurm_first_host("node[01-04]") == "node01");
  CHECK(slurm_first_host("node[07,01-04]") == "node07");
  CHECK(slurm_first_host("gpu[3-5],cpu[1-2]") == "gpu3");
  CHECK(slurm_first_host("rack[2-3]-n[1-4]") == "rack2-n1");
  CHECK(slurm_first_host("") == "");
}

TEST_CASE("SlurmEnv from the environment") {
  unsetenv("SLURM_NODEID");
  unsetenv("SLURM_NNODES");
  unsetenv("SLURM_JOB_NODELIST");
  CHECK_FALSE(SlurmEnv::from_environment().present);
  setenv("SLURM_NODEID", "2", 1);
  setenv("SLURM_NNODES", "4", 1);
  setenv("SLURM_JOB_NODELIST", "trn[005-008]", 1);
  SlurmEnv s = SlurmEnv::from_environment();
  CHECK(s.present);
  CHECK(s.node_rank == 2);
  CHECK(s.nodes == 4);
  CHECK(s.first_host == "trn005");
  setenv("SLURM_NNODES", "four", 1);
  CHECK_THROWS(SlurmEnv::from_environment());
  unsetenv("SLURM_NODEID");
  unsetenv("SLURM_NNODES");
  unsetenv("SLURM_JOB_NODELIST");
}
