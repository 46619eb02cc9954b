"""Expert parallel (#28 item 6): all_to_all(v) with uneven splits on a real torchrun gloo MoE job
(tests/support/jobs/expert_parallel.py), DeepEP and its forks' kernels and the async-TP fused ops on synthetic GPU traces, and the
ep_comm_exposed finding."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.jobs import run_ranks
from ..support.output import analyze_json
from ..support.traces import cpu, launched, step, write_trace

JOBS = Path(__file__).parents[1] / "support" / "jobs" / "expert_parallel.py"
RANKS = 3
HIDDEN, FLOAT = 8, 4


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moe")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", str(RANKS), str(JOBS), "moe", str(out)]
    run_ranks(cmd, out, check=True, timeout=240)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def _a2a_ops(run_dir: Path, rank: int) -> list[dict]:  # type: ignore[type-arg]
    (path,) = (run_dir / "traces").glob(f"rank{rank}_*.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [e for e in events if e.get("name") == "c10d::alltoall_base_" and e.get("ph") == "X"]


@pytest.mark.slow
def test_moe_all_to_all_bytes_tokens_and_imbalance(moe_run: Path) -> None:
    from ..support.jobs.expert_parallel import send_splits

    # GIVEN a MoE-style job on 3 gloo ranks: each step a dispatch (rank r sends send_splits(r) tokens) and the
    # combine back, with uneven splits, 2 steps recorded on every rank
    result = analyze_json(moe_run)
    expert = result["expert"]
    assert expert is not None
    by_rank = {r["rank"]: r for r in expert["ranks"]}
    received_tokens = {}
    for rank in range(RANKS):
        ops = _a2a_ops(moe_run, rank)
        send = send_splits(rank, RANKS)
        recv = [send_splits(src, RANKS)[rank] for src in range(RANKS)]
        steps = len(ops) // 2
        # THEN the all-to-alls are the c10d ops of the trace, with the bytes and tokens the splits say
        a2a = by_rank[rank]["all_to_all"]
        assert a2a["count"] == len(ops) == 4
        tokens = steps * (sum(send) + sum(recv))  # dispatch sends `send`, combine sends `recv` back
        assert a2a["sent_tokens"] == a2a["received_tokens"] == tokens
        assert a2a["sent_bytes"] == a2a["received_bytes"] == tokens * HIDDEN * FLOAT
        assert a2a["uneven"] is True
        assert a2a["time_source"] == "cpu" and a2a["time_ms"] > 0 and a2a["exposed_ms"] is None
        received_tokens[rank] = a2a["received_tokens"]
    # AND the imbalance is the largest rank's over the mean
    mean = sum(received_tokens.values()) / RANKS
    (tok,) = [i for i in expert["imbalance"] if i["figure"] == "received_tokens"]
    assert tok["max_rank"] == max(received_tokens, key=received_tokens.__getitem__)
    assert tok["ratio"] == pytest.approx(max(received_tokens.values()) / mean, abs=1e-4)
    assert tok["ranks"] == RANKS


def test_no_expert_section_without_all_to_all(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "r.json", [step(1, 0, 100), *launched("ampere_sgemm", 1, 10, 20, corr=1)])
    result = analyze_json(path)
    assert result["expert"] is None and result["tensor"] is None


EP_KERNELS = [
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*)", "intranode", "notify"),
    ("void deep_ep::intranode::dispatch<8, 768, 6144>(int4*, float*)", "intranode", "dispatch"),
    ("void deep_ep::internode::combine<false, 8>(int4*)", "internode", "combine"),
    ("void deep_ep::legacy::internode_ll::dispatch<true, false, 7168>(void*)", "low_latency", "dispatch"),
    ("void dpsk::ep::internode::cached_notify<false>(int, int)", "internode", "notify"),
    ("void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, dpsk::ep::internode::SourceMeta*)", "internode", "dispatch"),
    ("void acme::ep::low_latency::combine<7168>(void*)", "low_latency", "combine"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "transport", "phase"), EP_KERNELS)
def test_deepep_and_fork_kernels_are_all_to_all_communication(
    tmp_path: Path, name: str, transport: str, phase: str
) -> None:
    # GIVEN a GPU rank whose only collective is a DeepEP-style kernel beside a matmul
    events = [step(1, 0, 1000), *launched(name, 1, 10, 400, corr=1, stream=20)]
    events += launched("sm90_xmma_gemm_bf16", 2, 100, 100, corr=2)
    result = analyze_json(write_trace(tmp_path / "r.json", events))
    # THEN it is communication, listed by transport and phase, its time not under the matmul exposed
    kinds = {k["type"]: k["count"] for k in result["ranks"][0]["kernel_types"]["by_type"]}
    assert kinds["communication"] == 1 and kinds["computation"] == 1
    (ep,) = result["expert"]["ranks"][0]["ep_kernels"]
    assert (ep["transport"], ep["phase"], ep["count"]) == (transport, phase, 1)
    assert ep["time_ms"] == pytest.approx(0.4) and ep["exposed_ms"] == pytest.approx(0.3)


@pytest.mark.parametrize(
    "name",
    ["void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*)", "void dpsk::ep::cuda::get_dispatch_layout<1>(long*)"],
)  # fmt: skip
def test_deepep_local_kernels_are_computation(tmp_path: Path, name: str) -> None:
    result = analyze_json(
        write_trace(tmp_path / "r.json", [step(1, 0, 100), *launched(name, 1, 10, 20, corr=1)])
    )
    kinds = {k["type"]: k["count"] for k in result["ranks"][0]["kernel_types"]["by_type"]}
    assert (kinds["computation"], kinds["communication"]) == (1, 0) and result["expert"] is None


def _moe_gpu_rank(rank: int, combine_us: float) -> list[dict]:  # type: ignore[type-arg]
    """Two steps of 1000 us: a matmul (300 us), then dispatch (100 us) and combine (`combine_us`) with nothing
    under them."""
    events = []
    for n, t0 in ((1, 0.0), (2, 1000.0)):
        c = 10 * n
        events += [step(n, t0, 1000)]
        events += launched("sm90_xmma_gemm_bf16", t0 + 1, t0 + 10, 300, corr=c)
        events += launched("void deep_ep::internode::dispatch<false, 8>(int4*)", t0 + 2, t0 + 320, 100, corr=c + 1, stream=20)  # fmt: skip
        events += launched("void deep_ep::internode::combine<false, 8>(int4*)", t0 + 3, t0 + 430, combine_us, corr=c + 2, stream=20)  # fmt: skip
    return events


def test_ep_comm_exposed_priced_and_balance_chosen_by_imbalance(tmp_path: Path) -> None:
    # GIVEN two GPU ranks whose dispatch / combine run alone, rank 1's combine three times rank 0's
    write_trace(tmp_path / "rank0.json", _moe_gpu_rank(0, 100), 0)
    write_trace(tmp_path / "rank1.json", _moe_gpu_rank(1, 300), 1)
    result = analyze_json(tmp_path)
    # THEN the imbalance of dispatch + combine time is rank 1's: (100+300)*2 / mean((200+400*... per window)
    (imb,) = [i for i in result["expert"]["imbalance"] if i["figure"] == "ep_time_ms"]
    assert imb["max_rank"] == 1 and imb["ratio"] == pytest.approx(0.8 / 0.6, abs=1e-3)
    # AND ep_comm_exposed is priced by the exposed time per step (rank 1: 400 us of 1000), its action to balance
    (found,) = [f for f in result["findings"] if f["id"] == "ep_comm_exposed"]
    assert found["rank"] == 1 and found["cost_ms_per_step"] == pytest.approx(0.4)
    assert found["pct_of_step"] == pytest.approx(40.0, abs=0.5) and found["severity"] == "high"
    assert (
        "balance what the ranks send" in found["action"]
        and "ep_time_ms 1.33" in found["evidence"]["imbalance"]
    )


def test_ep_comm_exposed_overlap_when_balanced(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank0.json", _moe_gpu_rank(0, 200), 0)
    write_trace(tmp_path / "rank1.json", _moe_gpu_rank(1, 200), 1)
    result = analyze_json(tmp_path)
    found = [f for f in result["findings"] if f["id"] == "ep_comm_exposed"]
    assert found and all("overlap dispatch and combine" in f["action"] for f in found)
    assert found[0]["cost_ms_per_step"] == pytest.approx(0.3)


def test_async_tp_fused_op_is_communication_under_its_matmul(tmp_path: Path) -> None:
    from ..support.traces import kernel, runtime

    # GIVEN a fused all-gather + matmul (symm_mem op and its record_function): a peer copy on the copy stream
    # (200 us) overlapping its matmul (150 us) on the compute stream
    events = [
        step(1, 0, 1000),
        cpu("symm_mem::fused_all_gather_matmul", 5, 60),
        cpu("fused_all_gather_matmul", 6, 58, cat="user_annotation"),
        runtime("cudaMemcpyAsync", 10, 1, corr=1),
        kernel("Memcpy PtoP (Device -> Device)", 20, 200, stream=30, corr=1, cat="gpu_memcpy"),
        *launched("sm90_xmma_gemm_bf16f32_bf16f32", 20, 100, 150, corr=2),
    ]
    result = analyze_json(write_trace(tmp_path / "r.json", events))
    # THEN the copy is communication, 150 of its 200 us under the matmul
    (fused,) = result["tensor"]["ranks"][0]["fused"]
    assert (fused["op"], fused["count"]) == ("fused_all_gather_matmul", 1)
    assert fused["comm_ms"] == pytest.approx(0.2) and fused["compute_ms"] == pytest.approx(0.15)
    assert fused["overlapped_ms"] == pytest.approx(0.12) and fused["exposed_ms"] == pytest.approx(0.08)
    comm = result["ranks"][0]["communication"]
    assert comm is not None and comm["comm_us"] == pytest.approx(200)


def test_files_without_ranks_analysed_side_by_side_keep_the_ranks_they_are_given(tmp_path: Path) -> None:
    # GIVEN two files that declare no rank, analysed by two processes (each sees its file as rank 0)
    write_trace(tmp_path / "a.json", _moe_gpu_rank(0, 100), None)
    write_trace(tmp_path / "b.json", _moe_gpu_rank(1, 300), None)
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", "analyze", str(tmp_path), "--json", "--jobs", "2"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads(done.stdout)
    # THEN the expert view's ranks are the ranks the files were given, as everywhere else
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert sorted(r["rank"] for r in result["expert"]["ranks"]) == [0, 1]
