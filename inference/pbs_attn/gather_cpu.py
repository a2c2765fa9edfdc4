"""CPU fast path: vectorised gather of the selected K/V blocks + batched GEMMs, exact softmax per row.

Work unit is a *row*: one (batch, query head, query block ``i``). A row attends to its selected
off-diagonal key blocks (all strictly in its past, no mask needed) and to every block of its own
segment (token-level causal mask on original indices, ``perm[key] <= query``). Rows are sorted by their
number of off-diagonal blocks (descending) and processed in chunks of rows; per chunk one
``index_select`` gathers the permuted K and V blocks of all its rows into a padded buffer laid out as::

    [ off-diagonal blocks (count c_r), padded to the chunk max M | own-segment blocks (S/B) ]

then one ``bmm`` for Q·Kᵀ (q pre-scaled), ``-inf`` on the padded slots and on the causal-masked entries
of the own-segment columns, one softmax over the whole row (exact, not online: every key of the row is in
the buffer) and one ``bmm`` with V. Unselected blocks are never gathered nor multiplied; the dense
(N, N) matrix never exists. The Python loop is over chunks of rows: a chunk holds as many rows as fit
a ~4 MiB score budget (tens of rows at 4K-8K; at 16K-32K one row's scores alone are 2-5 MiB, so a chunk
is one row, i.e. ~15 tensor ops for ~0.3 GFLOP of GEMM work).
Sorting by count keeps the padding (wasted GEMM work) to a few per cent.

Attention runs on permuted K/V (Lemma 3.1: a joint K/V permutation leaves the output unchanged).
bf16/fp16 inputs are computed in fp32 (CPU bf16 GEMMs would round the logits to bf16) and cast back;
fp64 stays fp64.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from inference.pbs_attn.algorithm import PBSPlan, block_segments, permute_kv

# Score-buffer budget per chunk, in fp32 elements of Q·Kᵀ: 1M = 4 MiB (the two cores' L2 together).
# Measured at 8K on the 2-core Xeon (2 MiB L2/core, large L3): 1-2M best, 0.25M pays per-chunk
# overhead (+30 %), 16M falls out of cache (+110 %). At 16K-32K one row alone is 2-5 MiB, so chunks
# hold a few rows there and tens of rows at short lengths.
DEFAULT_CHUNK_ELEMS = 1024 * 1024


def _off_diagonal_lists(plan: PBSPlan) -> tuple[Tensor, Tensor]:
    """Per (batch, q_head, query block): #selected off-diagonal blocks and their indices (ascending first)."""
    t = plan.num_blocks
    seg = block_segments(t, plan.segment_size, plan.block_size, plan.block_mask.device)
    off = plan.block_mask & (seg[None, :] != seg[:, None])
    count = off.sum(dim=-1)
    idx = torch.argsort((~off).to(torch.int8), dim=-1, stable=True)
    return count, idx


def gather_pbs_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: PBSPlan,
    *,
    scale: float | None = None,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
    q_tile: int | None = None,
    workers: int | None = None,
) -> Tensor:
    """Block-sparse causal attention for ``plan`` on CPU by gathered batched GEMMs (see module docstring)."""
    if q.device.type != "cpu":
        raise ValueError(f"the gather backend runs on CPU tensors; got {q.device} (use 'triton' on CUDA)")
    bsz, hq, n, d = q.shape
    bs, t = plan.block_size, plan.num_blocks
    spb = plan.segment_size // bs
    n_pad = t * bs
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    with torch.no_grad():
        k_perm, v_perm = permute_kv(k, v, plan.perm)  # (b, ph, n, d); ph = kv heads or q heads
        ph = k_perm.shape[1]
        group = hq // ph
        pad_rows = (0, 0, 0, n_pad - n)
        # Flat block stores with one trailing all-zero "dummy" block that padded slots point at.
        n_blocks = bsz * ph * t
        kb = torch.zeros(n_blocks + 1, bs, d, dtype=work)
        vb = torch.zeros(n_blocks + 1, bs, d, dtype=work)
        kb[:n_blocks].view(bsz, ph, n_pad, d)[:, :, :n] = k_perm
        vb[:n_blocks].view(bsz, ph, n_pad, d)[:, :, :n] = v_perm
        # reshape, not view: q is often a strided view (transformers hands over a transposed (B, N, H, D))
        # and elementwise ops keep that layout, so the flat block view may need a copy
        qb = torch.nn.functional.pad(q.to(work) * scale, pad_rows).reshape(bsz * hq * t, bs, d)
        # Original index of every permuted key slot; padded/dummy slots get n_pad (> every query position).
        key_pos = torch.full((n_blocks + 1, bs), n_pad, dtype=torch.int64)
        key_pos[:n_blocks].view(bsz, ph, n_pad)[:, :, :n] = plan.perm.cpu()

        # ---- row metadata, rows = (b, h, i) flattened in that order
        count, off_idx = _off_diagonal_lists(plan)
        count, off_idx = count.cpu().reshape(-1), off_idx.cpu().reshape(-1, t)
        rows = count.numel()
        b_of = torch.arange(bsz).repeat_interleave(hq * t)
        h_of = torch.arange(hq).repeat_interleave(t).repeat(bsz)
        i_of = torch.arange(t).repeat(bsz * hq)
        base = (b_of * ph + h_of // group) * t  # first block of the row's (batch, perm head) in kb
        seg_blocks = (i_of // spb * spb)[:, None] + torch.arange(spb)  # (rows, spb) own-segment blocks
        diag_idx = torch.where(seg_blocks < t, base[:, None] + seg_blocks, n_blocks)
        order = torch.argsort(count, descending=True, stable=True)

        # Chunk schedule first, so that every buffer is allocated once (fresh multi-MiB allocations per
        # chunk cost page faults) and reused through ``out=`` views.
        # ``q_tile`` < B splits each chunk's queries into sub-tiles sharing one K/V gather (smaller score
        # buffer). Measured at 8K/16K (2 threads): no gain over whole 128-query blocks, so off by default.
        workers = torch.get_num_threads() if workers is None else workers
        schedule: list[tuple[int, int, int, int]] = []  # (first sorted row, #rows, max #off blocks, qt)
        start = 0
        while start < rows:
            m = int(count[order[start]])
            width = (m + spb) * bs
            r = max(1, min(rows - start, chunk_elems // (bs * width)))
            qt = bs if q_tile is None else min(q_tile, bs)
            schedule.append((start, r, m, qt))
            start += r
        out = torch.empty(rows, bs, d, dtype=work)
        q_off = torch.arange(bs)

        # grad and inference mode are thread-local: a worker runs in the caller's, or writing into ``out``
        # (an inference tensor when the caller is in inference mode) fails outside it
        inference = torch.is_inference_mode_enabled()

        def run(chunks: list[tuple[int, int, int, int]]) -> None:
            with torch.inference_mode(inference), torch.no_grad():
                run_chunks(chunks)

        def run_chunks(chunks: list[tuple[int, int, int, int]]) -> None:
            if not chunks:
                return
            if workers > 1:
                torch.set_num_threads(1)  # per OS thread (OpenMP/MKL thread-local): no intra-op teams
            kv_elems = max(r * (m + spb) * bs * d for _, r, m, _ in chunks)
            kg_buf = torch.empty(kv_elems, dtype=work)
            vg_buf = torch.empty(kv_elems, dtype=work)
            s_buf = torch.empty(max(r * qt * (m + spb) * bs for _, r, m, qt in chunks), dtype=work)
            q_buf = torch.empty(max(r for _, r, _, _ in chunks) * bs * d, dtype=work)
            o_buf = torch.empty_like(q_buf)

            for start, r, m, qt in chunks:
                sel = order[start : start + r]
                width = (m + spb) * bs
                pad = torch.arange(m)[None, :] >= count[sel, None]  # (r, m) padded off-diagonal slots
                off = torch.where(pad, n_blocks, base[sel, None] + off_idx[sel, :m])
                idx = torch.cat([off, diag_idx[sel]], dim=1).reshape(-1)  # (r * (m + spb),)
                kg = torch.index_select(kb, 0, idx, out=kg_buf[: r * width * d].view(-1, bs, d)).view(
                    r, width, d
                )
                vg = torch.index_select(vb, 0, idx, out=vg_buf[: r * width * d].view(-1, bs, d)).view(
                    r, width, d
                )
                qg = torch.index_select(qb, 0, sel, out=q_buf[: r * bs * d].view(r, bs, d))
                pads = pad.nonzero(as_tuple=True) if m and bool(pad.any()) else None
                q_pos = (i_of[sel] * bs)[:, None] + q_off  # (r, bs) original query positions
                diag_pos = key_pos[diag_idx[sel]].view(r, 1, spb * bs)
                o = o_buf[: r * bs * d].view(r, bs, d)
                for s0 in range(0, bs, qt):
                    scores = torch.bmm(
                        qg[:, s0 : s0 + qt],
                        kg.transpose(1, 2),
                        out=s_buf[: r * qt * width].view(r, qt, width),
                    )
                    if pads is not None:
                        scores.view(r, qt, m + spb, bs).transpose(1, 2)[pads] = float("-inf")
                    scores[:, :, m * bs :].masked_fill_(
                        diag_pos > q_pos[:, s0 : s0 + qt, None], float("-inf")
                    )
                    torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # in place, exact per row
                    if qt == bs:
                        torch.bmm(scores, vg, out=o)
                    else:
                        o[:, s0 : s0 + qt] = torch.bmm(scores, vg)
                out.index_copy_(0, sel, o)

        if workers > 1:
            # One single-threaded worker per core, chunks dealt round-robin (sorted order balances the
            # load). Intra-op OpenMP teams would meet at a barrier ~10 times per chunk; on a shared box a
            # descheduled team thread then stalls every region (measured: 3-10x slower under contention).
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(run, [schedule[w::workers] for w in range(workers)]))
        else:
            run(schedule)
        result = out.view(bsz, hq, n_pad, d)[:, :, :n]
    return result.to(q.dtype)
