"""Beam-search decoding of the abstractive head (modeling/generate.py): speed and memory.

Random weights and random token ids on real CNN/DM sentence lengths (only lengths matter for speed);
every summary is forced to exactly --target-tokens subwords (min_length = max_length) so that every
configuration does the same work. All ratios are measured inside one run, the configurations
interleaved round by round, so that a machine whose load changes slows every configuration alike.

  * batching: summary tokens/s of --batch documents at once against one document at a time (beam 5);
  * KV cache: the cached decoder against recomputing the whole prefix at every step (same search);
  * memory: peak memory of beam 5 against beam 1. CPU: the growth of the process's peak resident set
    (VmHWM, reset through /proc/self/clear_refs) above its resident set before decoding (model weights
    and the batch already there), in a fresh process per measurement so that no allocator cache from an
    earlier run hides anything; reported for the whole call and for the decoding phase (after the encoder
    and the memory projections). CUDA: torch.cuda.max_memory_allocated above the allocation before.
  * cross-attention: PHT (and VHT) against flat, same batch.
  * profile (--profile, CPU): where the time of one document goes at batch 1 and at --batch, ms per
    document by kind of operator (torch.profiler, self time), the encoder pass counted apart: which costs
    batching shares across documents and which it cannot. CUDA: per cross-attention variant, a step's wall
    time against the GPU's busy time (kernels), kernels launched and host syncs per step, and the operators
    that keep the GPU busy: whether decoding is bound by the host (Python, dispatch, launches) or the device.
  * the anchors: the same model and documents decoded with PreSumm's / hiersumm's search strategy
    (anchor_decode.py: memory tiled per beam and gathered every step, cache grown by concatenation, a
    Python trigram check per hypothesis, finished hypotheses kept in the beam), at the same batch size;
    speed and peak memory (RSS) against ours. A greedy run of both first checks they decode the same tokens.
Ratios are medians over rounds of the per-round ratio (the two runs of a ratio are back to back in each
round); the tables give the sums over all rounds.

    python benchmarks/bench_generate.py                          # 2 CPU threads, H=256: the CPU targets
    python benchmarks/bench_generate.py --device cuda --dtype bf16 --size hibert_m --batch 64
    python benchmarks/bench_generate.py --profile --skip throughput,cache,memory   # what batching shares
    python benchmarks/bench_generate.py --device cuda --dtype bf16 --size hibert_m --batch 64 --profile \
        --skip throughput,cache,memory --cross flat,pht --out benchmarks/results/bench_generate_cuda_profile.json
    python benchmarks/bench_generate.py --no-repeat-ngram 0 --cross flat --skip cache,memory \
        --out benchmarks/results/bench_generate_cpu_noblock.json     # the anchors' gap without blocking
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from hibert.config.abstractive import DecoderConfig, GenerationConfig  # noqa: E402
from hibert.config.model import ModelConfig  # noqa: E402
from hibert.modeling.abstractive import HibertAbstractive  # noqa: E402
from anchor_decode import anchor_generate  # noqa: E402
from hibert.modeling.generate import NEVER_GENERATED, generate  # noqa: E402
from hibert.modeling.packing import pack_documents  # noqa: E402
from recompute_decode import RecomputePrefix  # noqa: E402
from hibert.runtime.allocator import keep_freed_memory  # noqa: E402
from workload import machine  # noqa: E402

SIZES = {"small": dict(hidden=256, heads=4, layers=6), "hibert_m": dict(hidden=768, heads=12, layers=6)}
TARGETS = {"batch_speedup": 3.0, "cache_speedup": 2.0, "memory_ratio_max": 1.3, "pht_time_ratio_max": 1.2}


def sentence_lengths(seed: int) -> list[int]:
    """CNN/DM sentence lengths (words + EOS, at most 51) when the shared data is there, else uniform."""
    try:
        from workload import cnndm_lengths

        lens = [n for doc in cnndm_lengths(limit=400) for n in doc]
    except OSError:
        lens = np.random.default_rng(seed).integers(8, 46, 4000).tolist()
    return lens


def make_docs(n: int, tokens: int, vocab: int, seed: int) -> list[list[np.ndarray]]:
    """`n` documents of exactly `tokens` encoder tokens (words + one EOS per sentence)."""
    rng = np.random.default_rng(seed)
    lens = sentence_lengths(seed)
    docs = []
    for _ in range(n):
        doc, left, i = [], tokens, int(rng.integers(len(lens)))
        while left > 1:
            size = min(lens[i % len(lens)], left)
            doc.append(rng.integers(6, vocab, size - 1))
            left -= size
            i += 1
        docs.append(doc)
    return docs


def build(args, cross: str) -> HibertAbstractive:
    size = SIZES[args.size]
    enc = ModelConfig(name=args.size, vocab_size=args.vocab, dropout=0.0, max_positions=512, **size)
    dec = DecoderConfig(layers=size["layers"], dropout=0.0, cross_attention=cross, max_positions=512)
    torch.manual_seed(args.seed)
    return HibertAbstractive(enc, dec).to(args.device).eval()


def gen_config(args, beam: int) -> GenerationConfig:
    return GenerationConfig(beam_size=beam, min_length=args.target_tokens, max_length=args.target_tokens,
                            length_penalty=0.6, no_repeat_ngram=args.no_repeat_ngram, batch_size=args.batch)


def word_start_mask(vocab: int, device: str) -> torch.Tensor:
    """A SentencePiece-like mask: about 70% of pieces start a word."""
    return torch.from_numpy(np.random.default_rng(1).random(vocab) < 0.7).to(device)


def autocast(args):
    return torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_call(model, docs, decode, args) -> tuple[float, float, list]:
    """(seconds for `decode(batch)` over `docs` in one batch, seconds of that spent encoding, its output)."""
    batch = pack_documents(docs).to(args.device)
    with torch.no_grad(), autocast(args):
        sync(args.device)
        start = time.perf_counter()
        out = decode(batch)
        sync(args.device)
        total = time.perf_counter() - start
        start = time.perf_counter()
        model.encode(batch)
        sync(args.device)
        encode = time.perf_counter() - start
    return total, encode, out


def run_once(model, docs, gen, ws, args, use_cache: bool = True) -> tuple[float, float]:
    """(seconds for generate() over `docs` in batches of len(docs), seconds of that spent encoding)."""
    searched = model if use_cache else RecomputePrefix(model)  # the prefix recomputed at every step
    total, encode, hyps = timed_call(model, docs, lambda b: generate(searched, b, gen, word_start=ws), args)
    assert all(len(h.tokens) == gen.max_length for h in hyps), [len(h.tokens) for h in hyps]
    return total, encode


def run_anchor(model, docs, gen, ws, args) -> tuple[float, float]:
    """`run_once` for the anchors' search: the same steps (max_length subwords + the EOS step), the same
    documents, the same banned tokens; trigram blocking as they do it."""
    steps = gen.max_length + 1
    total, encode, out = timed_call(model, docs, lambda b: anchor_generate(
        model, b, gen.beam_size, steps, steps, gen.length_penalty, gen.no_repeat_ngram > 0, ws, NEVER_GENERATED), args)
    assert all(len(x) == steps for x in out), [len(x) for x in out]
    return total, encode


def check_anchor_matches(args, ws) -> int:
    """Greedy without blocking, forced length: the anchors' search and ours must pick the same tokens (the
    comparison is then about the search machinery alone). Returns the number of tokens compared."""
    model = build(args, "flat")
    docs = make_docs(min(args.batch, 4), args.source_tokens, args.vocab, args.seed + 2)
    batch = pack_documents(docs).to(args.device)
    gen = gen_config(args, 1).model_copy(update={"no_repeat_ngram": 0, "min_length": 20, "max_length": 20})
    with torch.no_grad(), autocast(args):
        ours = [h.tokens for h in generate(model, batch, gen, word_start=ws)]
        theirs = anchor_generate(model, batch, 1, 21, 21, gen.length_penalty, False, ws, NEVER_GENERATED)
    if [t[:20] for t in theirs] != ours:
        raise SystemExit("the anchors' greedy search decodes other tokens than ours: the comparison would be void")
    return sum(len(t) for t in ours)


def timed(configs: dict, rounds: int) -> dict:
    """Interleaved rounds: one call of every configuration per round; sums of seconds and documents."""
    out = {name: dict(seconds=[], encode_seconds=[], docs=0) for name in configs}
    for fn in configs.values():  # warm-up
        fn(warmup=True)
    for r in range(rounds):
        for name, fn in configs.items():
            log(f"round {r + 1}/{rounds}: {name}")
            seconds, encode, docs = fn(warmup=False)
            out[name]["seconds"].append(seconds)
            out[name]["encode_seconds"].append(encode)
            out[name]["docs"] += docs
    return out


def summarize(raw: dict, target_tokens: int) -> dict:
    res = {}
    for name, r in raw.items():
        seconds, enc = sum(r["seconds"]), sum(r["encode_seconds"])
        tokens = r["docs"] * target_tokens
        per_round = tokens / len(r["seconds"])
        res[name] = dict(docs=r["docs"], seconds=seconds, summaries_per_s=r["docs"] / seconds,
                         summary_tokens_per_s=tokens / seconds, encode_seconds=enc,
                         decode_tokens_per_s=tokens / max(seconds - enc, 1e-9), round_seconds=r["seconds"],
                         round_tokens_per_s=[per_round / x for x in r["seconds"]])
    return res


def paired_ratio(res: dict, a: str, b: str) -> tuple[float, list[float], float]:
    """Median over rounds of a's tokens/s over b's, each round's two runs back to back (a machine whose
    speed drifts between rounds does not bias it), the per-round values, and the pooled ratio (all
    rounds' tokens over all rounds' seconds)."""
    ratios = [x / y for x, y in zip(res[a]["round_tokens_per_s"], res[b]["round_tokens_per_s"])]
    return statistics.median(ratios), ratios, res[a]["summary_tokens_per_s"] / res[b]["summary_tokens_per_s"]


def throughput(args, ws) -> dict:
    docs = make_docs(args.batch, args.source_tokens, args.vocab, args.seed)
    models = {c: build(args, c) for c in args.cross}
    gen = gen_config(args, args.beam)
    short = gen.model_copy(update={"min_length": 4, "max_length": 4})

    def single(warmup: bool):  # one document at a time, args.single_docs of them
        seconds = encode = 0.0
        for d in docs[: 1 if warmup else args.single_docs]:
            s, e = run_once(models["flat"], [d], short if warmup else gen, ws, args)
            seconds, encode = seconds + s, encode + e
        return seconds, encode, args.single_docs

    def batched(cross: str):
        def fn(warmup: bool):
            s, e = run_once(models[cross], docs, short if warmup else gen, ws, args)
            return s, e, len(docs)
        return fn

    def anchor(warmup: bool):
        s, e = run_anchor(models["flat"], docs, short if warmup else gen, ws, args)
        return s, e, len(docs)

    # each ratio's two runs back to back in every round: batch 1 / flat / the anchors' search / pht / vht
    batch = f"_batch{args.batch}"
    configs = {"flat_batch1": single, "flat" + batch: batched("flat"), "anchor" + batch: anchor,
               **{c + batch: batched(c) for c in args.cross if c != "flat"}}
    return summarize(timed(configs, args.rounds), args.target_tokens)


def cache_vs_recompute(args, ws) -> dict:
    docs = make_docs(args.cache_batch, args.source_tokens, args.vocab, args.seed + 1)
    model = build(args, "flat")
    gen = gen_config(args, args.beam)
    short = gen.model_copy(update={"min_length": 4, "max_length": 4})

    def make(use_cache: bool):
        def fn(warmup: bool):
            s, e = run_once(model, docs, short if warmup else gen, ws, args, use_cache=use_cache)
            return s, e, len(docs)
        return fn

    return summarize(timed({"kv_cache": make(True), "recompute_prefix": make(False)}, args.cache_rounds),
                     args.target_tokens)


# ------------------------------------------------------------------------------------------ profile
_KINDS = (  # (row, operators): the first row whose operators include an op's name takes it
    ("linear layers", ("aten::addmm",)),
    ("cross-attention matmuls (q K^T, p V)", ("aten::bmm", "aten::baddbmm")),
    ("fused attention (SDPA)", ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                "aten::_scaled_dot_product_efficient_attention", "aten::_flash_attention_forward")),
    ("log-softmax and softmax", ("aten::_log_softmax", "aten::_softmax")),
    ("copies, gathers, cache reorder", ("aten::copy_", "aten::_index_put_impl_", "aten::index_select",
                                        "aten::index_copy_", "aten::gather", "aten::index", "aten::cat")),
    ("masks, fills, elementwise", ("aten::masked_fill_", "aten::fill_", "aten::add_", "aten::add", "aten::mul",
                                   "aten::mul_", "aten::clamp_min", "aten::where", "aten::native_layer_norm")),
)
_VOCAB_ROW, _OTHER = "output projection (V columns)", "views, reshapes, other small ops"


def _by_kind(prof) -> dict[str, float]:
    """Self time (ms) of a profiled call by kind of operator. The output projection is the one product
    without a bias (tied to the embedding table: aten::mm); every other linear layer is an addmm."""
    out = {_VOCAB_ROW: 0.0, **{row: 0.0 for row, _ in _KINDS}, _OTHER: 0.0}
    for e in prof.key_averages():
        row = _VOCAB_ROW if e.key == "aten::mm" else next((r for r, ops in _KINDS if e.key in ops), _OTHER)
        out[row] += e.self_cpu_time_total / 1000
    return out


def op_profile(args, ws) -> dict:
    """ms per document by kind of operator, one decode at batch 1 and one at --batch (the first of the
    documents / all of them); the encoder pass profiled on its own and taken out of the decode's rows into
    its own. Two plain decodes first (the second timed: wall without the profiler), then two profiled ones,
    the second kept. Without record_shapes: recording every operator's shapes slows the decode's largest
    writes (the [rows, V] logits) ~2x at batch 16, which would misplace the time. The profiler adds ~1 us
    per operator, which weighs more at batch 1."""
    from torch.profiler import profile

    model = build(args, "flat")
    docs = make_docs(args.batch, args.source_tokens, args.vocab, args.seed)
    gen = gen_config(args, args.beam)
    out = {}
    for name, group in (("batch1", docs[:1]), (f"batch{args.batch}", docs)):
        batch, n = pack_documents(group).to(args.device), len(group)
        decode = lambda: generate(model, batch, gen, word_start=ws)  # noqa: E731
        with torch.no_grad(), autocast(args):
            decode()
            start = time.perf_counter()
            decode()
            plain = time.perf_counter() - start
            with profile() as enc_prof:
                model.encode(batch)
            for _ in range(2):  # the second is kept
                with profile() as prof:
                    start = time.perf_counter()
                    decode()
                    wall = time.perf_counter() - start  # before the profiler's own teardown
        encoder = sum(e.self_cpu_time_total for e in enc_prof.key_averages()) / 1000
        rows = _by_kind(prof)
        for row, ms in _by_kind(enc_prof).items():  # the encoder's share of each kind, taken out
            rows[row] = max(0.0, rows[row] - ms)
        ops = sum(rows.values()) + encoder
        out[name] = {"encoder pass": encoder / n, **{k: v / n for k, v in rows.items()},
                     "outside operators (Python, dispatch)": max(0.0, wall * 1000 - ops) / n,
                     "wall (profiler on)": wall * 1000 / n, "wall (profiler off)": plain * 1000 / n}
        log(f"profiled {name}: {plain * 1000 / n:.0f} ms per document ({wall * 1000 / n:.0f} with the profiler)")
    return out


_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def cuda_profile(args, ws) -> dict:
    """Per cross-attention variant, one decode at batch 1 and one at --batch (the first of the documents / all
    of them): ms per step of wall time (profiler off, one decode) and of GPU busy time (the sum of kernel and
    device copy/fill times: one stream, so they do not overlap), device operations (kernels, copies, fills) and
    host syncs per step, and the operators with the most GPU time (ms per step). A "step" is the call's time over
    max_length + 1 decoding steps, the encoder pass included. Wall well above busy time means the host (Python,
    dispatch, launches) sets the pace: a larger batch then costs little more per step."""
    from torch.profiler import ProfilerActivity, profile

    docs = make_docs(args.batch, args.source_tokens, args.vocab, args.seed)
    gen = gen_config(args, args.beam)
    steps = gen.max_length + 1
    out: dict = {}
    for cross in args.cross:
        model = build(args, cross)
        for name, group in (("batch1", docs[:1]), (f"batch{args.batch}", docs)):
            batch = pack_documents(group).to(args.device)
            with torch.no_grad(), autocast(args):
                generate(model, batch, gen, word_start=ws)  # warm-up (kernel selection, allocator)
                sync(args.device)
                start = time.perf_counter()
                generate(model, batch, gen, word_start=ws)
                sync(args.device)
                wall = time.perf_counter() - start
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    generate(model, batch, gen, word_start=ws)
                    sync(args.device)
            events = prof.key_averages()
            device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
            ops = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU
                          and e.key.startswith("aten::") and e.self_device_time_total > 0),
                         key=lambda e: -e.self_device_time_total)
            busy = sum(e.self_device_time_total for e in device) / 1000
            out[f"{cross}_{name}"] = {
                "wall_ms_per_step": wall * 1000 / steps, "gpu_busy_ms_per_step": busy / steps,
                "kernels_per_step": sum(e.count for e in device) / steps,
                "host_syncs_per_step": sum(e.count for e in events if e.key in _SYNCS) / steps,
                "top_ops_gpu_ms_per_step": {e.key: e.self_device_time_total / 1000 / steps for e in ops[:8]}}
            log(f"profiled {cross} {name}: {wall * 1000 / steps:.2f} ms per step, GPU busy {busy / steps:.2f}")
    return out


# ------------------------------------------------------------------------------------------ memory
def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def _tensor_bytes(prof, mark: str) -> tuple[int, int, int]:
    """Live bytes allocated through torch's CPU allocator during the profiled call, from the profiler's
    per-op allocation records in time order: (peak before `mark`, live at `mark`, peak after it)."""
    live = before = at = after = 0
    seen_mark = False
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        if e.name == mark:
            seen_mark, at = True, live
        live += e.self_cpu_memory_usage
        if seen_mark:
            after = max(after, live)
        else:
            before = max(before, live)
    return before, at, after


def anchor_memory_probe(args, beam: int) -> dict:
    """Runs in a fresh process: peak memory (RSS, or CUDA allocated) of one anchor-strategy call at `beam`."""
    model = build(args, "flat")
    ws = word_start_mask(args.vocab, args.device)
    batch = pack_documents(make_docs(args.batch, args.source_tokens, args.vocab, args.seed)).to(args.device)
    gen = gen_config(args, beam)
    steps = gen.max_length + 1
    cuda = args.device == "cuda"
    with torch.no_grad(), autocast(args):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            _reset_peak()
            before = _status_kib("VmRSS") * 1024
        anchor_generate(model, batch, beam, steps, steps, gen.length_penalty, gen.no_repeat_ngram > 0, ws,
                        NEVER_GENERATED)
        peak = torch.cuda.max_memory_allocated() if cuda else _status_kib("VmHWM") * 1024
    mib = 2**20
    return dict(beam=beam, kind="cuda_allocated" if cuda else "rss", baseline_mib=before / mib,
                peak_mib=(peak - before) / mib)


def memory_probe(args, beam: int, kind: str) -> dict:
    """Runs in a fresh process: peak memory of one generate() call at `beam`, whole call and decoding
    phase. `kind`: rss (process resident set) or tensors (torch CPU allocator, via the profiler)."""
    if kind == "anchor":
        return anchor_memory_probe(args, beam)
    model = build(args, "flat")
    ws = word_start_mask(args.vocab, args.device)
    docs = make_docs(args.batch, args.source_tokens, args.vocab, args.seed)
    batch = pack_documents(docs).to(args.device)
    gen = gen_config(args, beam)
    marks = {}
    start_decoding = model.start_decoding
    cuda = args.device == "cuda"

    def marked_start(*a, **k):  # the encoder and the memory projections are done when this returns
        state = start_decoding(*a, **k)
        if cuda:
            torch.cuda.synchronize()
            marks["encode_peak"] = torch.cuda.max_memory_allocated()
            marks["decode_start"] = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        elif kind == "rss":
            marks["encode_peak"], marks["decode_start"] = _status_kib("VmHWM") * 1024, _status_kib("VmRSS") * 1024
            _reset_peak()
        else:
            with torch.profiler.record_function("decode_start"):
                pass
        return state

    model.start_decoding = marked_start
    with torch.no_grad(), autocast(args):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            generate(model, batch, gen, word_start=ws)
            decode_peak = torch.cuda.max_memory_allocated()
        elif kind == "rss":
            _reset_peak()
            before = _status_kib("VmRSS") * 1024
            generate(model, batch, gen, word_start=ws)
            decode_peak = _status_kib("VmHWM") * 1024
        else:
            before = 0
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
                generate(model, batch, gen, word_start=ws)
            marks["encode_peak"], marks["decode_start"], decode_peak = _tensor_bytes(prof, "decode_start")
    mib = 2**20
    return dict(beam=beam, kind="cuda_allocated" if cuda else kind, baseline_mib=before / mib,
                encode_peak_mib=(marks["encode_peak"] - before) / mib,
                decode_start_mib=(marks["decode_start"] - before) / mib,
                decode_peak_mib=(decode_peak - before) / mib,
                peak_mib=(max(marks["encode_peak"], decode_peak) - before) / mib)


def memory(args) -> dict:
    out = {}
    kinds = ["cuda"] if args.device == "cuda" else ["rss", "tensors"]
    def probe(beam: int, kind: str) -> dict:
        """The median (by peak) of --memory-repeats fresh-process probes for RSS, whose allocator noise is tens
        of MiB; one probe for the deterministic tensor and CUDA counts."""
        runs = []
        for r in range(args.memory_repeats if kind in ("rss", "anchor") else 1):
            log(f"memory probe: {kind}, beam {beam} ({r + 1})")
            cmd = [sys.executable, __file__, "--memory-probe", f"{beam},{kind}"] + sys.argv[1:]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        runs.sort(key=lambda x: x["peak_mib"])
        return {**runs[len(runs) // 2], "repeats_peak_mib": [x["peak_mib"] for x in runs]}

    for kind in kinds:
        for beam in (1, args.beam):
            out[f"{kind}_beam{beam}"] = probe(beam, kind)
    out[f"anchor_beam{args.beam}"] = probe(args.beam, "anchor")
    return out


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ main
def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=16, help="documents decoded together")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--source-tokens", type=int, default=800, help="encoder tokens per document")
    p.add_argument("--target-tokens", type=int, default=100, help="summary subwords (min_length = max_length)")
    p.add_argument("--no-repeat-ngram", type=int, default=3,
                   help="word n-gram blocking for every search (0 = off; the anchors' search blocks trigrams iff > 0)")
    p.add_argument("--single-docs", type=int, default=2, help="documents decoded one at a time per round")
    p.add_argument("--cache-batch", type=int, default=4, help="documents in the cache vs recompute runs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache-rounds", type=int, default=1)
    p.add_argument("--memory-repeats", type=int, default=3, help="fresh-process RSS probes per setting (median)")
    p.add_argument("--cross", default="flat,pht,vht", help="cross-attention variants timed at --batch")
    p.add_argument("--skip", default="", help="comma list of throughput,cache,memory to leave out")
    p.add_argument("--profile", action="store_true",
                   help="also profile one decode at batch 1 and at --batch: ms per document by kind of operator "
                        "(CPU); host against GPU time per step (CUDA)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
    p.add_argument("--default-malloc", action="store_true",
                   help="keep glibc's malloc defaults (summarize keeps freed memory for reuse on the CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.cross = args.cross.split(",")
    if "flat" not in args.cross:
        args.cross.insert(0, "flat")
    if args.dtype == "bf16" and args.device != "cuda":
        p.error("--dtype bf16 is for --device cuda")
    return args


def ratio_line(value: float, target: float | None, higher_is_better: bool = True, rounds: list | None = None,
               pooled: float | None = None) -> dict:
    line = dict(value=value)
    if rounds is not None:
        line.update(rounds=rounds, pooled=pooled)
    if target is not None:
        line.update(target=(">= " if higher_is_better else "<= ") + f"{target}",
                    met=value >= target if higher_is_better else value <= target)
    return line


def main() -> None:
    args = parse()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
        if not args.default_malloc:
            keep_freed_memory()  # as `hibert summarize` does on the CPU (finetune/inference/decoding.py)
    if args.memory_probe is not None:
        beam, kind = args.memory_probe.split(",")
        print(json.dumps(memory_probe(args, int(beam), kind)))
        return
    skip = set(filter(None, args.skip.split(",")))
    ws = word_start_mask(args.vocab, args.device)
    model = build(args, "flat")
    params = sum(p.numel() for p in model.parameters())
    del model
    summary = dict(args={k: str(v) for k, v in vars(args).items() if k != "memory_probe"},
                   machine={**machine(), "torch_threads": torch.get_num_threads()}, model=SIZES[args.size],
                   vocab=args.vocab, parameters=params, results={}, ratios={})
    res, ratios = summary["results"], summary["ratios"]
    started = time.perf_counter()
    if "throughput" not in skip:
        summary["anchor_check_tokens"] = check_anchor_matches(args, ws)
        log(f"the anchors' greedy search decodes ours: {summary['anchor_check_tokens']} tokens equal")
        res["throughput"] = throughput(args, ws)
        t = res["throughput"]
        b = f"_batch{args.batch}"
        value, rounds, pooled = paired_ratio(t, "flat" + b, "flat_batch1")
        ratios["batch_speedup"] = ratio_line(value, TARGETS["batch_speedup"], True, rounds, pooled)
        ratios["batch_speedup_decode_only"] = ratio_line(t["flat" + b]["decode_tokens_per_s"]
                                                         / t["flat_batch1"]["decode_tokens_per_s"], None)
        for cross in ("pht", "vht"):
            if cross in args.cross:  # time ratio = inverse tokens/s ratio, same documents
                value, rounds, pooled = paired_ratio(t, "flat" + b, cross + b)
                target = TARGETS["pht_time_ratio_max"] if cross == "pht" else None
                ratios[f"{cross}_time_ratio"] = ratio_line(value, target, False, rounds, pooled)
        value, rounds, pooled = paired_ratio(t, "flat" + b, "anchor" + b)
        ratios["speedup_over_anchor_search"] = ratio_line(value, None, True, rounds, pooled)
    if "cache" not in skip:
        res["cache"] = cache_vs_recompute(args, ws)
        value, rounds, pooled = paired_ratio(res["cache"], "kv_cache", "recompute_prefix")
        ratios["cache_speedup"] = ratio_line(value, TARGETS["cache_speedup"], True, rounds, pooled)
    if "memory" not in skip:
        res["memory"] = memory(args)
        for kind in ["cuda"] if args.device == "cuda" else ["rss", "tensors"]:
            m1, mk = res["memory"][f"{kind}_beam1"], res["memory"][f"{kind}_beam{args.beam}"]
            ratios[f"memory_ratio_{kind}"] = ratio_line(mk["peak_mib"] / m1["peak_mib"],
                                                        TARGETS["memory_ratio_max"], False)
            ratios[f"memory_ratio_{kind}_decode_phase"] = ratio_line(
                mk["decode_peak_mib"] / m1["decode_peak_mib"], TARGETS["memory_ratio_max"], False)
        ours = res["memory"][f"{'cuda' if args.device == 'cuda' else 'rss'}_beam{args.beam}"]
        ratios["anchor_memory_ratio"] = ratio_line(res["memory"][f"anchor_beam{args.beam}"]["peak_mib"]
                                                   / ours["peak_mib"], None)
    if args.profile and args.device == "cuda":
        res["cuda_profile"] = cuda_profile(args, ws)
    elif args.profile:
        res["profile"] = op_profile(args, ws)
        b = f"batch{args.batch}"
        ratios["profile_wall_ratio"] = ratio_line(res["profile"]["batch1"]["wall (profiler off)"]
                                                  / res["profile"][b]["wall (profiler off)"], None)
    summary["wall_seconds"] = time.perf_counter() - started

    print(f"{args.size} (H={SIZES[args.size]['hidden']}, {SIZES[args.size]['layers']}+{SIZES[args.size]['layers']} "
          f"encoder + {SIZES[args.size]['layers']} decoder layers, V={args.vocab}, {params / 1e6:.1f}M params) "
          f"{args.dtype} on {summary['machine'].get('gpu') if args.device == 'cuda' else summary['machine']['cpu']}"
          f", {torch.get_num_threads()} threads; beam {args.beam}, {args.source_tokens} source tokens, "
          f"{args.target_tokens} summary tokens per document")
    for group, rows in res.items():
        if group == "cuda_profile":
            print(f"{'profile (per decoding step)':44} {'wall ms':>8} {'GPU ms':>7} {'kernels':>8} {'syncs':>6}  "
                  f"top operators by GPU time (ms)")
            for name, r in rows.items():
                top = list(r["top_ops_gpu_ms_per_step"].items())[:3]
                top = ", ".join(f"{k.removeprefix('aten::')} {v:.2f}" for k, v in top)
                print(f"  {name:42} {r['wall_ms_per_step']:8.2f} {r['gpu_busy_ms_per_step']:7.2f} "
                      f"{r['kernels_per_step']:8.0f} {r['host_syncs_per_step']:6.2f}  {top}")
            continue
        if group == "profile":
            b = f"batch{args.batch}"
            print(f"{'profile (ms per document, self time)':44} {'batch 1':>9} {'batch ' + str(args.batch):>9} "
                  f"{'shared':>7}")
            for kind in rows["batch1"]:
                one, many = rows["batch1"][kind], rows[b][kind]
                print(f"  {kind:42} {one:9.1f} {many:9.1f} {one / many if many > 0.05 else float('nan'):6.1f}x")
            continue
        if group == "memory":
            print(f"{'memory (MiB above the pre-call baseline)':44} {'encoder phase':>14} {'decode start':>13} "
                  f"{'decode peak':>12} {'call peak':>10}")
            for name, r in rows.items():
                if "decode_peak_mib" not in r:  # the anchors' search: whole call only
                    print(f"  {name:42} {'':>14} {'':>13} {'':>12} {r['peak_mib']:10.1f}")
                    continue
                print(f"  {name:42} {r['encode_peak_mib']:14.1f} {r['decode_start_mib']:13.1f} "
                      f"{r['decode_peak_mib']:12.1f} {r['peak_mib']:10.1f}")
            continue
        print(f"{group:44} {'docs':>5} {'seconds':>8} {'summ/s':>7} {'tok/s':>7} {'decode tok/s':>13}")
        for name, r in rows.items():
            print(f"  {name:42} {r['docs']:5d} {r['seconds']:8.2f} {r['summaries_per_s']:7.2f} "
                  f"{r['summary_tokens_per_s']:7.1f} {r['decode_tokens_per_s']:13.1f}")
    for name, r in ratios.items():
        target = f" (target {r['target']}: {'met' if r['met'] else 'NOT met'})" if "target" in r else ""
        rounds = ""
        if len(r.get("rounds", [])) > 1:
            rounds = f"  rounds: {', '.join(f'{x:.2f}' for x in r['rounds'])}; pooled {r['pooled']:.2f}"
        print(f"{name:44} {r['value']:.2f}{target}{rounds}")
    out = args.out or REPO / "benchmarks/results" / f"bench_generate_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
