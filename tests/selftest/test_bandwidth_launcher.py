"""Pure logic: bus bandwidth, reference table, NCCL log parsing, transport; launchers."""

from __future__ import annotations

import json

import pytest

from builder.selftest.phases import bandwidth as bw
from builder.selftest.launch import distributed as dd
from builder.selftest.launch import launcher as ln
from builder.selftest.report import Check

TABLE = bw.load_reference()


def test_bus_bandwidth_formula() -> None:
    algbw, busbw = bw.bus_bandwidth(2**30, 2**30 / 100e9, 8)
    assert algbw == pytest.approx(100.0) and busbw == pytest.approx(175.0)
    assert bw.bus_bandwidth(1000, 1e-6, 2)[1] == pytest.approx(1.0)
    assert bw.bus_bandwidth(1000, 1e-6, 1)[1] is None


class TestReferenceTable:
    def test_shipped_table_loads(self) -> None:
        assert len(TABLE) >= 5 and all(e["origin"] == bw.DEFAULT_TABLE for e in TABLE)

    @pytest.mark.parametrize("name, gpus, inter, ref", [
        ("NVIDIA H100 80GB HBM3", 8, "nvlink", 370.0),
        ("NVIDIA H200", 8, "nvlink", 365.0),
        ("NVIDIA A100-SXM4-80GB", 8, "nvlink", 232.0),
        ("NVIDIA B200", 8, "nvlink", 680.0),
        ("AMD Instinct MI300X", 8, "xgmi", 315.0),      # 45 per peer x 7
        ("AMD Instinct MI300X", 2, "xgmi", 45.0),
        ("NVIDIA H100 PCIe", 8, "pcie", 48.0),
        ("NVIDIA A100 80GB PCIe", 8, "pcie", 24.0),
    ])
    def test_lookup(self, name: str, gpus: int, inter: str, ref: float) -> None:
        hit = bw.lookup_reference(TABLE, name, gpus, 1, inter)
        assert hit is not None and hit[1] == pytest.approx(ref)

    @pytest.mark.parametrize("name, gpus, nodes, inter", [
        ("NVIDIA H100 80GB HBM3", 4, 1, "nvlink"),     # n < 8 not sourced
        ("NVIDIA H100 NVL", 8, 1, "nvlink"),           # excluded variant
        ("NVIDIA L40S", 8, 1, "nvlink"),               # unknown model
        ("NVIDIA H100 80GB HBM3", 8, 2, "ib"),         # no multi-node default
        ("AMD Instinct MI300X", 1, 1, "xgmi"),
    ])
    def test_no_reference(self, name: str, gpus: int, nodes: int, inter: str) -> None:
        assert bw.lookup_reference(TABLE, name, gpus, nodes, inter) is None

    def test_site_override_wins(self, tmp_path) -> None:
        f = tmp_path / "site.json"
        f.write_text(json.dumps({"schema": "verl-env/bw-ref/v1", "entries": [
            {"name": "site H100 2 nodes", "match": ["H100"], "interconnect": "ib", "gpus": 8,
             "nodes": 2, "busbw": 350},
            {"match": ["H100"], "interconnect": "nvlink", "gpus": 8, "busbw": 440}]}))
        table = bw.load_reference(str(f))
        assert bw.lookup_reference(table, "NVIDIA H100 80GB HBM3", 8, 1, "nvlink")[1] == 440
        assert bw.lookup_reference(table, "NVIDIA H100 80GB HBM3", 8, 2, "ib")[1] == 350

    @pytest.mark.parametrize("data, word", [
        ({"schema": "x/v2", "entries": []}, "schema"),
        ({"entries": "no"}, "list"),
        ([{"match": [], "busbw": 1}], "match"),
        ([{"match": ["a"]}], "exactly one"),
        ([{"match": ["a"], "busbw": 1, "per_peer": 2}], "exactly one"),
        ([{"match": ["a"], "busbw": -1}], "positive"),
        ([{"match": ["a"], "busbw": 1, "gpus": "8"}], "integer"),
    ])
    def test_malformed(self, data: object, word: str) -> None:
        with pytest.raises(bw.BwRefError, match=word):
            bw.parse_reference(data, "f.json")

    def test_unreadable(self, tmp_path) -> None:
        with pytest.raises(bw.BwRefError, match="cannot read"):
            bw.load_reference(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("name, nodes, net, key", [
    ("NVIDIA H100 80GB HBM3", 1, None, "nvlink"), ("NVIDIA H100 PCIe", 1, None, "pcie"),
    ("AMD Instinct MI300X", 1, None, "xgmi"), ("X", 2, "IB", "ib"),
    ("X", 2, "Socket", "socket"), ("X", 2, None, "unknown"),
])
def test_guess_interconnect(name: str, nodes: int, net: str | None, key: str) -> None:
    assert bw.guess_interconnect(name, nodes, net) == key


class TestBusbwDecision:
    REF = ({"name": "8x H100", "source": "GTC24", "origin": "t"}, 370.0)

    def test_pass_warn_fail(self) -> None:
        assert bw.decide_busbw(480.0, 8, self.REF, "k", True).status == "pass"   # NVLS above
        assert bw.decide_busbw(340.0, 8, self.REF, "k", True).status == "pass"
        warn = bw.decide_busbw(300.0, 8, self.REF, "k", True)
        assert warn.status == "warn" and "below 0.9" in warn.reason
        fail = bw.decide_busbw(200.0, 8, self.REF, "k", True)
        assert fail.status == "fail" and fail.threshold["value"] == pytest.approx(277.5)
        assert fail.threshold["warn_below"] == pytest.approx(333.0)

    def test_unknown_hardware_records_value_as_skip(self) -> None:
        c = bw.decide_busbw(123.4, 8, None, "NVIDIA L40S x8", True)
        assert c.status == "skip" and c.value == 123.4 and not c.required
        assert c.reason.startswith("no reference")

    def test_one_rank(self) -> None:
        c = bw.decide_busbw(None, 1, self.REF, "k", True)
        assert c.status == "skip" and "1 rank" in c.reason and not c.required

    def test_not_measured(self) -> None:
        c = bw.decide_busbw(None, 8, self.REF, "k", True)
        assert c.status == "skip" and c.required

    def test_custom_fractions(self) -> None:
        assert bw.decide_busbw(300.0, 8, self.REF, "k", True, 0.8, 0.5).status == "pass"


NCCL_IB_LOG = """\
node1:123:123 [0] NCCL INFO NCCL version 2.27.3+cuda13.0
node1:123:140 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>
node1:123:140 [0] NCCL INFO Using network IB
node1:123:141 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
node1:123:141 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0
"""
NCCL_SOCKET_LOG = """\
h:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.1.1<0>
h:1:1 [0] NCCL INFO Using network Socket
h:1:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
"""
RCCL_LOG = "h:1:1 [0] NCCL INFO RCCL version 2.22.3+hip6.3\nh:1:2 [0] NCCL INFO Channel 00/0 : " \
           "0[0] -> 1[1] via P2P/IPC\nh:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM\n"


class TestTransport:
    def test_parse_ib(self) -> None:
        p = bw.parse_nccl_log(NCCL_IB_LOG)
        assert p["version"] == "2.27.3" and p["network"] == "IB"
        assert p["channels"] == ["NET/IB", "P2P/CUMEM"] and not p["nvls"]

    def test_parse_rccl_and_nvls(self) -> None:
        p = bw.parse_nccl_log(RCCL_LOG + "h:1:1 [0] NCCL INFO NVLS multicast support available\n")
        assert p["version"] == "2.22.3" and p["network"] is None and p["nvls"]
        assert p["channels"] == ["P2P/IPC", "SHM"]

    def test_describe(self) -> None:
        ib, sock = bw.parse_nccl_log(NCCL_IB_LOG), bw.parse_nccl_log(NCCL_SOCKET_LOG)
        assert bw.describe_transport([ib], 2, "nccl") == "IB"
        assert bw.describe_transport([sock], 2, "nccl") == "sockets"
        assert bw.describe_transport([bw.parse_nccl_log(RCCL_LOG)], 1, "nccl") == \
            "intra-node (P2P/IPC+SHM)"
        assert bw.describe_transport([], 1, "nccl") == "unknown (no NCCL log)"
        assert bw.describe_transport([], 3, "gloo") == "gloo/tcp"
        assert bw.describe_transport([{"network": "AWS Libfabric", "channels": []}], 2,
                                     "nccl") == "AWS Libfabric"

    def test_decide(self) -> None:
        assert bw.decide_transport("intra-node (P2P/IPC)", 1, True, True).status == "pass"
        assert bw.decide_transport("gloo/tcp", 2, False, False).status == "pass"
        assert bw.decide_transport("IB", 2, True, True).status == "pass"
        silent = bw.decide_transport("sockets", 2, True, True)
        assert silent.status == "fail" and "although RDMA" in silent.reason
        assert bw.decide_transport("sockets", 2, False, True).status == "warn"
        assert bw.decide_transport("unknown (no NCCL log)", 2, True, True).status == "warn"

    def test_debug_file_pattern(self) -> None:
        assert bw.expand_debug_file("/s/nccl.%h.%p.log", "node7.cluster", 42) == \
            "/s/nccl.node7.42.log"


class TestLauncher:
    def test_standalone(self) -> None:
        info = ln.detect({})
        assert info.launcher == "standalone" and not info.distributed

    def test_torchrun(self) -> None:
        info = ln.detect({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3",
                          "MASTER_ADDR": "n1", "MASTER_PORT": "29400",
                          "SLURM_PROCID": "0", "SLURM_STEP_ID": "1"})   # torchrun inside srun
        assert (info.launcher, info.rank, info.world_size, info.local_rank) == \
            ("torchrun", 3, 8, 3)
        assert ln.dist_env(info) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3",
                                     "MASTER_ADDR": "n1", "MASTER_PORT": "29400"}

    def test_torchrun_needs_master(self) -> None:
        with pytest.raises(ln.LauncherError, match="MASTER_ADDR"):
            ln.detect({"RANK": "0", "WORLD_SIZE": "2"})

    def test_srun(self) -> None:
        info = ln.detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                          "SLURM_STEP_ID": "0", "SLURM_NODELIST": "gpu[07-08]"})
        assert (info.launcher, info.rank, info.world_size, info.local_rank) == \
            ("slurm", 5, 16, 1)
        assert info.master_addr == "gpu07" and info.master_port == ln.DEFAULT_PORT
        assert info.nodelist == ("gpu07", "gpu08")

    def test_srun_prefers_step_values_and_env_master(self) -> None:
        info = ln.detect({"SLURM_PROCID": "1", "SLURM_NTASKS": "64", "SLURM_STEP_NUM_TASKS": "2",
                          "SLURM_STEPID": "3", "SLURM_NODELIST": "a,b",
                          "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})
        assert info.world_size == 2 and info.master_addr == "10.0.0.1"
        assert info.master_port == 1234

    def test_batch_script_is_not_a_rank(self) -> None:
        # sbatch exports SLURM_PROCID=0 and SLURM_NTASKS to the batch script: no srun step.
        assert ln.detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}).launcher == "standalone"

    def test_force_and_errors(self) -> None:
        assert ln.detect({"RANK": "0", "WORLD_SIZE": "2"}, "standalone").launcher == "standalone"
        with pytest.raises(ln.LauncherError, match="inconsistent"):
            ln.detect({"RANK": "4", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"})
        with pytest.raises(ln.LauncherError, match="integer"):
            ln.detect({"RANK": "x", "WORLD_SIZE": "2"})
        with pytest.raises(ln.LauncherError, match="SLURM_PROCID"):
            ln.detect({}, "slurm")

    @pytest.mark.parametrize("text, hosts", [
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("a1,a2", ["a1", "a2"]),
        ("x[1-2]-ib", ["x1-ib", "x2-ib"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("", []),
    ])
    def test_expand_nodelist(self, text: str, hosts: list[str]) -> None:
        assert ln.expand_nodelist(text) == hosts


def test_merge_suffixes_hosts_only_across_nodes() -> None:
    local = [Check("preflight.shm", "preflight", "pass").to_dict(internal=True)]
    coll = [Check("collective.nccl_allreduce", "collective", "pass")]
    one, hosts = dd.merge([{"host": "a", "local": local}, {"host": "a", "local": []}], coll)
    assert [c.id for c in one] == ["preflight.shm", "collective.nccl_allreduce"]
    assert hosts == ["a"]
    two, hosts = dd.merge([{"host": "a", "local": local}, {"host": "b", "local": local}], coll)
    assert [c.id for c in two] == ["preflight.shm@a", "preflight.shm@b",
                                   "collective.nccl_allreduce"]
    assert hosts == ["a", "b"]
