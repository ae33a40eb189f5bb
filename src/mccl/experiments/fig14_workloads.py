"""The two training workloads of mccl-paper §6.3 (Fig. 14) as plain data: collectives, sizes, counts, groups.

Sources: ``shared/reference/workloads.md`` (Llama-3.1-405B, DeepSeek-V3-671B, scaled to one
pipeline stage of PP16), re-derived here from the model shapes so that a reader can check
every byte (:func:`llama_volumes`, :func:`deepseek_volumes`; ``tests/test_fig14.py`` compares
them with workloads.md).

Placement (one pipeline stage on ``N`` GPUs = ``N/128`` HPN segments of 16 hosts × 8 GPUs;
the paper: a simulation of N GPUs stands for a PP16 job of 16·N GPUs):

* Llama: TP8 = the 8 GPUs of one host (NVLink). DP = every host of the stage, one GPU per
  host on the same rail: 8 DP groups of N/8 GPUs, one per rail. A DP group crosses the
  aggregation layer as soon as the stage spans more than one segment (N > 128). workloads.md
  states DP8 "at 1024 GPUs" (its 1024 counts all 16 stages); one stage of N GPUs has N/8 DP
  ranks, so the DP group here is N/8 wide. FSDP shards shrink with DP width, the per-GPU
  nccl-tests S (the whole stage's parameters per TP rank) does not.
* DeepSeek: EP64 = 8 consecutive hosts (two EP groups per segment); ZeRO-1 DP
  ReduceScatter / AllGather over the same 64 GPUs, as workloads.md states.
* The step (two definitions, :data:`STEPS`). Headline (``"16k"``): the paper's — "a forward and
  backward pass on a batch of 16K tokens" (§6.3, Table 1 "batch size 16K") — per DP rank:
  16384 / sequence = 2 micro-batches of 8192 tokens (Llama), 4 of 4096 (DeepSeek); the
  per-step collectives (FSDP / ZeRO-1) run once. Variant (``"gbs"``): workloads.md's full
  global-batch step, 256 (Llama) / 240 (DeepSeek) micro-batches per DP rank. Either is held
  at every size: weak scaling, so every GPU does the same work per step at every N.
* Pipeline send/recv is left out, as the paper does ("only simulate one pipeline stage as
  traffic between stages is point-to-point"); its volume is reported in the workload's notes.
* The EP AllToAll is uniform over the 64 GPUs of its group (nccl-tests S = the per-GPU send
  buffer). DeepSeek's node-limited routing sends at most 4 of 8 token copies across the NIC;
  a uniform AllToAll sends 56/64 of its bytes off-host: it over-states the NIC bytes by
  1.75× (and so the healthy communication time). Compute time is derived from the
  communication share (:mod:`mccl.experiments.fig14`), so the speedups depend on ratios only.
"""

from __future__ import annotations

from dataclasses import dataclass

from mccl.errors import MCCLError
from mccl.schedule import Collective

__all__ = ["CollectiveCall", "Workload", "STEPS", "STEP_TOKENS", "LLAMA", "DEEPSEEK", "WORKLOADS", "llama_volumes", "deepseek_volumes",
           "groups", "GPUS_PER_HOST", "HOSTS_PER_SEGMENT", "check_size"]

GPUS_PER_HOST = 8
HOSTS_PER_SEGMENT = 16  # mccl-paper §6.3: HPN segments of 128 GPUs
MiB = 2**20
STEP_TOKENS = 16384  # mccl-paper §6.3 / Table 1: one forward and backward pass on a batch of 16K tokens
STEPS = ("16k", "gbs")  # the paper's 16K-token step (headline), workloads.md's global-batch step


@dataclass(frozen=True)
class CollectiveCall:
    """One line of the workload table: a collective over every group of ``group`` kind.

    ``size_bytes`` is nccl-tests S per GPU (AllGather: output, ReduceScatter: input, AllToAll:
    send buffer); ``per_microbatch`` calls per micro-batch, ``per_step`` calls per step."""

    name: str
    short: str  # for tables
    collective: Collective
    group: str  # "tp", "dp" (Llama), "ep" (DeepSeek: EP and its ZeRO-1 DP)
    size_bytes: float
    per_microbatch: int = 0
    per_step: int = 0

    def count(self, microbatches: int) -> int:
        return self.per_microbatch * microbatches + self.per_step


@dataclass(frozen=True)
class Workload:
    """A training step: its collectives, how many micro-batches, the paper's numbers."""

    name: str
    short: str  # for tables
    calls: tuple[CollectiveCall, ...]
    microbatches: int  # per DP rank in workloads.md's global-batch step
    sequence: int  # tokens per micro-batch (one sequence)
    comm_share: float  # mccl-paper §6.3: collectives' share of the healthy (NCCL) step time
    paper_fail2_peak: float  # mccl-paper §6.3, Fig. 14: peak speedup under Fail2
    min_gpus: int  # the smallest stage the placement fits
    notes: str = ""

    def step_microbatches(self, step: str) -> int:
        """Micro-batches per DP rank in a step of kind ``step`` (:data:`STEPS`)."""
        if step == "16k":
            return STEP_TOKENS // self.sequence
        if step == "gbs":
            return self.microbatches
        raise MCCLError(f"unknown step {step!r}; known: {', '.join(STEPS)}")


def llama_volumes() -> dict[str, float]:
    """Llama-3.1-405B per-GPU volumes (bytes) from its shapes: 126 layers, d 16384, FFN 53248
    (SwiGLU), 128 heads, 8 KV heads of 128, vocab 128256, sequence 8192; TP8, PP16 → 8 layers
    per stage."""
    d, ffn, heads, kv_heads, head_dim, seq = 16384, 53248, 128, 8, 128, 8192
    attention = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2  # q, o; k, v
    layer = attention + 3 * d * ffn
    params_per_gpu = 8 * layer / 8  # 8 layers per stage, sharded over TP8
    return {
        "layer_params": float(layer),
        "params_per_gpu": params_per_gpu,
        "tp_activation": float(seq * d * 2),  # s·h in bf16: the sequence-parallel AllGather output
        "dp_allgather": params_per_gpu * 2,  # bf16 parameters
        "dp_reducescatter": params_per_gpu * 4,  # fp32 gradients
        "pp_activation": float(seq * d * 2) / 8,  # one micro-batch's boundary activation per TP rank
    }


def deepseek_volumes() -> dict[str, float]:
    """DeepSeek-V3 per-GPU volumes (bytes) from its shapes: d 7168, MLA (q rank 1536, kv rank 512,
    128 heads of 128+64), 58 MoE layers of 256 routed experts (FFN 2048) + 1 shared, 3 dense
    (FFN 18432), top-8, sequence 4096; PP16 → ≈ 4 MoE layers per stage; dispatch FP8 with one
    fp32 scale per 128 values (1.03125 B), combine BF16."""
    d, seq, top_k = 7168, 4096, 8
    mla = d * 1536 + 1536 * 128 * 192 + d * (512 + 64) + 512 * 128 * 256 + 128 * 128 * d
    expert = 3 * d * 2048
    dense_ffn = 3 * d * 18432
    non_expert = 61 * mla + 58 * expert + 3 * dense_ffn  # attention, shared experts, dense FFNs
    per_stage = non_expert / 16  # embeddings (first/last stage only) left out: a middle stage
    return {
        "non_expert_params_per_stage": per_stage,
        "dispatch": seq * top_k * d * (1 + 4 / 128),
        "combine": float(seq * top_k * d * 2),
        "zero1_reducescatter": per_stage * 4,  # fp32 gradients of the replicated (non-expert) parameters
        "zero1_allgather": per_stage * 2,  # bf16 parameters
        "pp_activation": float(seq * d * 2),
    }


def _llama() -> Workload:
    v = llama_volumes()
    tp = v["tp_activation"]
    calls = (
        CollectiveCall("TP AllGather (seq. parallel)", "TP AG", Collective.ALLGATHER, "tp", tp, per_microbatch=32),
        CollectiveCall("TP ReduceScatter (seq. parallel)", "TP RS", Collective.REDUCESCATTER, "tp", tp, per_microbatch=32),
        CollectiveCall("DP param AllGather (bf16)", "DP AG", Collective.ALLGATHER, "dp", v["dp_allgather"], per_step=1),
        CollectiveCall("DP grad ReduceScatter (fp32)", "DP RS", Collective.REDUCESCATTER, "dp", v["dp_reducescatter"],
                       per_step=1),
    )
    return Workload("Llama-3.1-405B", "Llama-405B", calls, microbatches=256, sequence=8192, comm_share=0.34, paper_fail2_peak=2.85,
                    min_gpus=HOSTS_PER_SEGMENT * GPUS_PER_HOST,
                    notes=f"PP send/recv left out (one stage): {v['pp_activation'] / MiB:.0f} MiB fwd + bwd "
                          "per micro-batch per GPU")


def _deepseek() -> Workload:
    v = deepseek_volumes()
    calls = (
        CollectiveCall("EP dispatch AllToAll fwd (FP8)", "EP A2A disp", Collective.ALLTOALL, "ep", v["dispatch"], per_microbatch=4),
        CollectiveCall("EP combine AllToAll fwd (BF16)", "EP A2A comb", Collective.ALLTOALL, "ep", v["combine"], per_microbatch=4),
        CollectiveCall("EP dispatch+combine bwd (BF16)", "EP A2A bwd", Collective.ALLTOALL, "ep", v["combine"], per_microbatch=8),
        CollectiveCall("ZeRO-1 grad ReduceScatter (fp32)", "ZeRO RS", Collective.REDUCESCATTER, "ep", v["zero1_reducescatter"],
                       per_step=1),
        CollectiveCall("ZeRO-1 param AllGather (bf16)", "ZeRO AG", Collective.ALLGATHER, "ep", v["zero1_allgather"], per_step=1),
    )
    return Workload("DeepSeek-V3-671B", "DeepSeek-V3", calls, microbatches=240, sequence=4096, comm_share=0.65, paper_fail2_peak=4.99,
                    min_gpus=HOSTS_PER_SEGMENT * GPUS_PER_HOST,
                    notes=f"PP send/recv left out (one stage): {v['pp_activation'] / MiB:.0f} MiB per micro-batch "
                          "per GPU; EP AllToAll uniform (node-limited routing would send 4/8 copies off-host, "
                          "uniform sends 56/64)")


LLAMA = _llama()
DEEPSEEK = _deepseek()
WORKLOADS: dict[str, Workload] = {"llama": LLAMA, "deepseek": DEEPSEEK}


def check_size(workload: Workload, n_gpus: int) -> None:
    """Refuse a stage the placement does not tile: whole segments of 128 GPUs, at least ``min_gpus``."""
    segment = HOSTS_PER_SEGMENT * GPUS_PER_HOST
    if n_gpus < workload.min_gpus or n_gpus % segment:
        raise MCCLError(f"{workload.name}: a stage of {n_gpus} GPUs does not tile HPN segments of {segment} GPUs "
                        f"(need a multiple of {segment}, at least {workload.min_gpus})")


def groups(workload: Workload, kind: str, n_gpus: int) -> list[tuple[str, ...]]:
    """Every group of ``kind`` on a stage of ``n_gpus`` GPUs, as GPU ids (``gpu{8·host + rail}``), the
    group holding ``gpu0`` first."""
    check_size(workload, n_gpus)
    hosts = n_gpus // GPUS_PER_HOST
    if kind == "tp":
        return [tuple(f"gpu{GPUS_PER_HOST * h + r}" for r in range(GPUS_PER_HOST)) for h in range(hosts)]
    if kind == "dp":
        return [tuple(f"gpu{GPUS_PER_HOST * h + r}" for h in range(hosts)) for r in range(GPUS_PER_HOST)]
    if kind == "ep":
        ep_hosts = 64 // GPUS_PER_HOST
        return [tuple(f"gpu{g}" for g in range(GPUS_PER_HOST * first, GPUS_PER_HOST * (first + ep_hosts)))
                for first in range(0, hosts, ep_hosts)]
    raise MCCLError(f"unknown group kind {kind!r}; known: tp, dp, ep")
