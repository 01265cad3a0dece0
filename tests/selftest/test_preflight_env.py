"""Pure logic of pre-flight and the environment lint, every branch and skip reason."""

from __future__ import annotations

import os
import resource

import pytest

from builder.selftest.phases import envlint as el
from builder.selftest.phases import preflight as pf
from builder.selftest.manifest import resolve_expectation

GiB = 2**30
INF = resource.RLIM_INFINITY


class TestShm:
    def test_missing(self) -> None:
        c = pf.decide_shm(None, 64 * GiB, False)
        assert c.status == "fail" and "missing" in c.reason

    def test_docker_default_fails_when_gpus_expected(self) -> None:
        c = pf.decide_shm(64 << 20, 64 * GiB, True)
        assert c.status == "fail" and c.value == pytest.approx(0.0625)
        assert c.threshold and c.threshold["value"] == 1.0

    def test_docker_default_warns_without_gpus(self) -> None:
        assert pf.decide_shm(64 << 20, 64 * GiB, False).status == "warn"

    def test_below_ray_fraction_warns(self) -> None:
        c = pf.decide_shm(2 * GiB, 64 * GiB, True)
        assert c.status == "warn" and "object store" in c.reason

    def test_large_passes(self) -> None:
        assert pf.decide_shm(32 * GiB, 64 * GiB, True).status == "pass"
        assert pf.decide_shm(32 * GiB, None, True).status == "pass"


class TestMemlock:
    def test_unlimited(self) -> None:
        assert pf.decide_memlock(INF, INF, True).status == "pass"

    def test_limited_with_rdma_fails(self) -> None:
        c = pf.decide_memlock(64 * 1024, INF, True)
        assert c.status == "fail" and c.value == 64 and c.unit == "KiB"

    def test_limited_without_rdma_warns(self) -> None:
        assert pf.decide_memlock(64 * 1024, INF, False).status == "warn"


def test_infiniband() -> None:
    skip = pf.decide_infiniband(None)
    assert skip.status == "skip" and not skip.required and not skip.applies
    assert "no /dev/infiniband" in skip.reason
    assert pf.decide_infiniband([]).status == "skip"
    c = pf.decide_infiniband(["uverbs1", "uverbs0"])
    assert c.status == "pass" and c.value == ["uverbs0", "uverbs1"]


class TestRocmDevices:
    def test_not_rocm_no_record(self) -> None:
        assert pf.decide_rocm_devices(False, False, "cuda", resolve_expectation(8, "cuda", 8)) \
            is None

    def test_present(self) -> None:
        e = resolve_expectation(None, "rocm", 8)
        assert pf.decide_rocm_devices(True, True, "rocm", e).status == "pass"

    def test_missing_with_gpus_expected_fails(self) -> None:
        c = pf.decide_rocm_devices(True, False, "rocm", resolve_expectation(8, "rocm", 0))
        assert c.status == "fail" and c.value == ["/dev/dri"]

    def test_missing_on_build_host_skips(self) -> None:
        c = pf.decide_rocm_devices(False, False, "rocm", resolve_expectation(None, "rocm", 0))
        assert c.status == "skip" and not c.required
        assert c.reason == "no GPU visible (build host)"


def test_libibverbs() -> None:
    c = pf.decide_libibverbs(None, "cpu")
    assert c.status == "skip" and "cpu target" in c.reason and not c.applies
    assert pf.decide_libibverbs("libibverbs.so.1", "cuda").status == "pass"
    miss = pf.decide_libibverbs(None, "rocm")
    assert miss.status == "warn" and "sockets" in miss.reason and not miss.required


class TestVisibleDevices:
    def test_differ_fails(self) -> None:
        c = el.lint_visible_devices({"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "0"})
        assert c.status == "fail"

    @pytest.mark.parametrize("env", [{}, {"HIP_VISIBLE_DEVICES": "0,1"},
                                     {"HIP_VISIBLE_DEVICES": "0,1",
                                      "CUDA_VISIBLE_DEVICES": "0,1"}])
    def test_ok(self, env: dict[str, str]) -> None:
        assert el.lint_visible_devices(env).status == "pass"


def test_rocr() -> None:
    assert el.lint_rocr({}, "rocm").status == "pass"
    c = el.lint_rocr({"ROCR_VISIBLE_DEVICES": "0"}, "rocm")
    assert c.status == "fail" and "HIP_VISIBLE_DEVICES" in c.reason
    assert el.lint_rocr({"ROCR_VISIBLE_DEVICES": "0"}, "cuda").status == "warn"


@pytest.mark.parametrize("env, status", [
    ({}, "pass"),
    ({"RAY_DEBUG": "legacy"}, "pass"),
    ({"RAY_DEBUG": "legacy", "RAY_DEBUG_POST_MORTEM": "1"}, "fail"),
    ({"RAY_DEBUG_POST_MORTEM": "1"}, "warn"),
    ({"RAY_DEBUG": "legacy", "RAY_DEBUG_POST_MORTEM": "0"}, "pass"),
])
def test_ray_debug(env: dict[str, str], status: str) -> None:
    assert el.lint_ray_debug(env).status == status


class TestNcclLists:
    @pytest.mark.parametrize("text, exclude, exact, names", [
        ("mlx5", False, False, ("mlx5",)),
        ("=mlx5_0:1,mlx5_1:1", False, True, ("mlx5_0", "mlx5_1")),
        ("^=mlx5_1,mlx5_4", True, True, ("mlx5_1", "mlx5_4")),
        ("^docker,lo", True, False, ("docker", "lo")),
    ])
    def test_parse(self, text: str, exclude: bool, exact: bool, names: tuple[str, ...]) -> None:
        assert el.parse_nccl_list(text) == el.NcclList(exclude, exact, names)

    def test_unset(self) -> None:
        assert el.lint_nccl_list("NCCL_IB_HCA", None, []).status == "pass"

    def test_prefix_matches(self) -> None:
        c = el.lint_nccl_list("NCCL_IB_HCA", "mlx5", ["mlx5_0", "mlx5_1"])
        assert c.status == "pass" and c.id == "env.nccl_ib_hca"

    def test_exact_needs_full_name(self) -> None:
        c = el.lint_nccl_list("NCCL_IB_HCA", "=mlx5", ["mlx5_0"])
        assert c.status == "fail" and "names no existing device" in c.reason

    def test_nonexistent_fails(self) -> None:
        c = el.lint_nccl_list("NCCL_SOCKET_IFNAME", "ib0", ["lo", "eth0"])
        assert c.status == "fail" and "present: eth0,lo" in c.reason

    def test_no_devices_at_all(self) -> None:
        assert el.lint_nccl_list("NCCL_IB_HCA", "=mlx5_0:1", None).status == "fail"

    def test_some_missing_warns(self) -> None:
        c = el.lint_nccl_list("NCCL_IB_HCA", "=mlx5_0:1,mlx5_9:1", ["mlx5_0"])
        assert c.status == "warn" and "mlx5_9" in c.reason

    def test_exclude_nonexistent_is_harmless(self) -> None:
        c = el.lint_nccl_list("NCCL_SOCKET_IFNAME", "^docker,lo", ["lo", "eth0"])
        assert c.status == "pass" and "eth0" in c.reason

    def test_exclude_everything_fails(self) -> None:
        c = el.lint_nccl_list("NCCL_SOCKET_IFNAME", "^e,l", ["lo", "eth0"])
        assert c.status == "fail" and "excludes every device" in c.reason

    def test_exact_exclude(self) -> None:
        assert el.lint_nccl_list("NCCL_SOCKET_IFNAME", "^=eth", ["eth0"]).status == "pass"


class TestNcclDisable:
    def test_unset_or_zero(self) -> None:
        assert el.lint_nccl_disable({}).status == "pass"
        assert el.lint_nccl_disable({"NCCL_IB_DISABLE": "0"}).status == "pass"

    def test_set_in_environment_warns(self) -> None:
        c = el.lint_nccl_disable({"NCCL_P2P_DISABLE": "1"})
        assert c.status == "warn" and c.value == {"NCCL_P2P_DISABLE": "1"}

    def test_baked_into_image_fails(self) -> None:
        text = '#!/bin/sh\nexport PATH="/opt/venv/bin:$PATH"\nexport NCCL_IB_DISABLE="1"\n'
        c = el.lint_nccl_disable({"NCCL_IB_DISABLE": "1"}, text)
        assert c.status == "fail" and c.value == ["NCCL_IB_DISABLE"]

    def test_baked_names(self) -> None:
        assert el.baked_names("export A=1\nB=2\n# C=3\n") == {"A", "B"}
        assert el.baked_names(None) == set()


class TestHfCache:
    def test_paths_defaults(self) -> None:
        assert el.hf_cache_paths({}, "/home/u") == [
            ("HF_HOME", "/home/u/.cache/huggingface"),
            ("HF_HUB_CACHE", "/home/u/.cache/huggingface/hub")]

    def test_paths_xdg_and_overrides(self) -> None:
        assert el.hf_cache_paths({"XDG_CACHE_HOME": "/c"}, "/h")[0] == ("HF_HOME", "/c/huggingface")
        assert el.hf_cache_paths({"HF_HOME": "/s/hf"}, "/h")[1] == ("HF_HUB_CACHE", "/s/hf/hub")
        assert el.hf_cache_paths({"HF_HUB_CACHE": "/x"}, "/h")[1] == ("HF_HUB_CACHE", "/x")

    def test_probe_writable(self, tmp_path) -> None:
        assert el.probe_writable(str(tmp_path)) == (True, "exists, writable")
        assert el.probe_writable(str(tmp_path / "a" / "b"))[0]
        blocker = tmp_path / "file"
        blocker.write_text("x")
        ok, detail = el.probe_writable(str(blocker / "hf"))
        assert not ok and "cannot be created" in detail
        assert not el.probe_writable(str(blocker))[0]
        assert [p for p in os.listdir(tmp_path) if p.startswith(".verl-env")] == []  # cleaned

    def test_lint(self) -> None:
        good = el.lint_hf_cache([("HF_HOME", "/a", True, "ok"), ("HF_HUB_CACHE", "/a/hub", True,
                                                                "ok")])
        assert good.status == "pass"
        bad = el.lint_hf_cache([("HF_HOME", "/ro", False, "exists, not writable")])
        assert bad.status == "fail" and "HF_HOME=/ro" in bad.reason


def test_node_devices_the_job_bound_must_be_in_the_container() -> None:
    """NVL72: the job lists the IMEX channels it found on the node (VERL_ENV_NODE_DEVICES); the
    self-test records them, and fails when one did not reach the container."""
    from builder.selftest.phases.preflight import decide_node_devices

    imex = "/dev/nvidia-caps-imex-channels"
    assert decide_node_devices(None, {}).status == "skip"
    ok = decide_node_devices(imex, {imex: True})
    assert ok.status == "pass" and ok.value == [imex]
    bad = decide_node_devices(imex, {imex: False})
    assert bad.status == "fail" and imex in bad.reason
