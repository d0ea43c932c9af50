"""A golden drift's cause named and proven (``reproci/stages/golden_cause.py``,
``golden/drift.py``): what selects the CPU kernels is recorded, an image digest alone is not an
upgrade, and a factor software can set is re-run with the golden's value."""

from __future__ import annotations

import pytest

from reproci import verdicts
from reproci.golden import drift
from reproci.golden.environment import host_diff
from reproci.stages.determinism.golden_cause import settings

from .helpers import model_entry

# Levels every x86-64 host with AVX2 has, so that the CPU-level tests run on any of them (an
# AVX2-only AMD EPYC and an AVX512 Intel Xeon alike): ATen's scalar kernels (its `default`
# level) below the AVX2 cap, and oneDNN capped at SSE4.1 below its own AVX2 ones.
ATEN_DEFAULT = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def _changes(**kw):
    base = {"packages": {}, "toolchain": {}, "host": {}, "digest": None}
    return {**base, **kw}


def test_a_new_digest_with_the_same_packages_is_not_an_upgrade():
    digest = ["sha256:5b42fb80338f" + "0" * 52, "sha256:0af7b6bb6d2e" + "0" * 52]
    verdict, why = drift._why(_changes(digest=digest, host={"cpu_capability": ["AVX2", "AVX512"]}))
    assert verdict == verdicts.ENV_CHANGED
    assert why == "CPU capability (ATen) AVX2 → AVX512; image rebuilt, same packages (digest sha256:5b42fb80338f → sha256:0af7b6bb6d2e)"
    verdict, why = drift._why(_changes(digest=digest))
    assert verdict == verdicts.GOLDEN_MISMATCH and why.startswith("image rebuilt, same packages")
    verdict, why = drift._why(_changes(digest=digest, packages={"torch": ["2.13.0", "2.14.1"]}))
    assert verdict == verdicts.UPGRADE_CHANGED and why == "torch 2.13.0 → 2.14.1"


def test_host_factors_are_listed_once_each_the_kernel_selectors_first():
    old = {"threads": {"intra_op": 1}, "cpu": "AMD EPYC 7B13", "cpu_capability": "AVX2", "kernel_env": {},
           "cpu_id": {"isa": ["avx2"]}}
    new = {"threads": {"intra_op": 2}, "cpu": "AMD EPYC 9B14", "cpu_capability": "AVX512",
           "kernel_env": {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "cpu_id": {"isa": ["avx2", "avx512f"]}}
    diff = host_diff(old, new, "cpu")
    assert list(diff) == ["cpu_capability", "kernel_env.ONEDNN_MAX_CPU_ISA", "cpu_id.isa", "threads.intra_op", "cpu"]
    verdict, why = drift._why(_changes(host=diff))
    assert why == ("CPU capability (ATen) AVX2 → AVX512, ONEDNN_MAX_CPU_ISA (unset) → AVX2, CPU instruction set "
                   "+avx512f, threads 1 → 2, CPU AMD EPYC 7B13 → AMD EPYC 9B14")


def test_what_software_can_set_is_set_back_and_the_rest_is_named():
    change, unsettable = settings({"cpu_capability": ["AVX2", "AVX512"], "kernel_env.ATEN_CPU_CAPABILITY": ["avx2", None],
                                   "threads.intra_op": [1, 2], "gpu.names": [["H100"], ["H200"]],
                                   "kernel_env.NVIDIA_TF32_OVERRIDE": [None, "0"]})
    assert change == {"cpu_isa": "avx2", "threads": 1, "env": {"NVIDIA_TF32_OVERRIDE": None}}
    assert unsettable == ["GPU ['H100'] → ['H200']"]


@pytest.mark.slow
def test_a_golden_recorded_at_the_avx2_level_is_env_changed_at_another_and_the_rerun_confirms_it(reproci):
    """Both runs at levels this host has: the golden under ``--cpu-isa avx2``, the run with ATen's
    kernels at its scalar level (oneDNN and MKL at AVX2 as under the cap). The re-run with the
    golden's cap matches it; a run with that cap passes."""
    assert reproci("golden", "update", "-m", "conv", "--steps", "4", "--cpu-isa", "avx2").returncode == 0
    r = reproci("run", "-m", "conv", "--steps", "4", env=ATEN_DEFAULT)
    assert r.returncode == 3, r.stderr
    m = model_entry(reproci.latest(), "conv")
    assert m["verdict"] == verdicts.ENV_CHANGED, m["message"]
    assert "(CPU capability (ATen) AVX2 → DEFAULT, ATEN_CPU_CAPABILITY avx2 → default)" in m["message"]
    assert m["golden"]["confirmation"]["confirmed"] is True and m["golden"]["confirmation"]["steps"] == 2
    assert m["message"].endswith("; confirmed: with ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 and "
                                 "MKL_ENABLE_INSTRUCTIONS=AVX2 (the golden's), conv matches the golden bit for bit "
                                 "through step 2: the CPU kernel level (the instruction set the kernels use) is the cause")
    assert reproci("run", "-m", "conv", "--steps", "4", "--cpu-isa", "avx2").returncode == 0  # capped: PASS


@pytest.mark.slow
def test_a_kernel_variable_set_by_hand_is_named_not_a_mismatch(reproci):
    """The golden was recorded with ONEDNN_MAX_CPU_ISA=SSE41 in the environment (not through
    --cpu-isa), below what any host with AVX2 picks by itself."""
    assert reproci("golden", "update", "-m", "conv", "--steps", "3",
                   env={"ONEDNN_MAX_CPU_ISA": "SSE41"}).returncode == 0
    r = reproci("run", "-m", "conv", "--steps", "3")
    assert r.returncode == 3, r.stderr
    m = model_entry(reproci.latest(), "conv")
    assert m["verdict"] == verdicts.ENV_CHANGED and "(ONEDNN_MAX_CPU_ISA SSE41 → (unset))" in m["message"], m["message"]
    assert m["golden"]["confirmation"]["confirmed"] is True
    assert "confirmed: with ONEDNN_MAX_CPU_ISA=SSE41 (the golden's)" in m["message"]
