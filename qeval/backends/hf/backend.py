"""The transformers backend: one setup, one process; batched scoring on CPU or CUDA.

Scoring follows lm-evaluation-harness (0.4.x `HFLM`) conventions: trailing context
whitespace moves to the continuation, the continuation's tokens are those of
`encode(context + continuation)` past `encode(context)`, the BOS token is prepended (as
`add_bos_token=True`), and rolling log-likelihood uses its disjoint-window scheme.

KV-cache quantization is only visible when a token attends to K/V that came *out of*
the cache, so the quantized path prefills all but the last context token into the cache
first and scores the rest in a second pass; generation decodes token by token from a
prefilled cache; perplexity text is scored through a round-trip cache (see kv_cache).
"""

from __future__ import annotations

import copy
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from qeval.backends.base import (
    TOPK,
    GenerateRequest,
    Generation,
    LoglikelihoodRequest,
    LoglikelihoodResult,
    MemoryFigure,
    Progress,
    RollingRequest,
    RollingResult,
    encoded_requests,
)
from qeval.backends.hf import chunked, kv_cache
from qeval.backends.hf import quant as hf_quant
from qeval.backends.hf import sampling as hf_sampling
from qeval.backends.hf.provenance import model_provenance
from qeval.backends.hf.support import decodes_from_cache
from qeval.backends.tokens import conventions, generation_context, rolling_windows
from qeval.config import RunConfig
from qeval.config.setups import QUANTIZED_WEIGHTS, Setup
from qeval.memory.ledger import cache_bytes, cache_storage_bytes, model_weights_bytes
from qeval.model.source import is_gguf

if TYPE_CHECKING:
    from qeval.backends.workload import Measurement, Workload

# Scoring runs under no_grad, not inference_mode: quanto's packed int4 weights fail on
# inference tensors ("Cannot set version_counter for inference tensor").
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class HFBackend:
    """Serves one Setup with transformers; see the module docstring for the conventions."""

    name = "hf"

    def __init__(self, cfg: RunConfig, setup: Setup, device: str) -> None:
        self.cfg, self.setup, self.device = cfg, setup, device
        self.batch_size = cfg.batch_size
        self.gen_batch_size = cfg.generation_batch_size or 4 * cfg.batch_size
        self.max_length = cfg.model.max_context
        # a window or prompt longer than this goes through the chunked, batch-1 path (hf/chunked.py)
        self.chunk = cfg.long_context.chunk_tokens if cfg.long_context else LONG_CHUNK
        self.model: Any = None
        self.tok: Any = None
        self._rss_after_load = 0
        self._gguf_dir: Any = None  # a private folder for a GGUF file (see _gguf_alone), removed with this object
        # every setup of a run with a KV setup decodes on the cache's path (hf/support.py decodes_from_cache)
        self.from_cache = setup.quantizes_kv or decodes_from_cache(cfg)

    # -- lifecycle -------------------------------------------------------------------
    def load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        spec = self.cfg.model
        dtype = _DTYPES[spec.dtype if self.setup.weights in (None, *QUANTIZED_WEIGHTS) else _weights_dtype(self.setup)]
        kw: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code, "revision": spec.revision}
        path = spec.path
        if self.setup.checkpoint:  # pre-quantized: transformers' quantizer for its quant_method loads it
            path, kw["revision"] = self.setup.checkpoint, self.setup.checkpoint_revision
        if is_gguf(path):  # dequantized on load into `dtype`: the GGUF's own precision is the baseline's
            path, kw["gguf_file"] = self._gguf_alone(Path(path)), Path(path).name
        # a checkpoint's own tokenizer, as vLLM reads it; the model's where the checkpoint ships none
        has_tok = (
            not self.setup.checkpoint
            or not Path(path).is_dir()
            or any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
        )
        self.tok = AutoTokenizer.from_pretrained(
            path if has_tok else spec.path, **(kw if has_tok else kw | {"revision": spec.revision})
        )
        load = hf_quant.load_kwargs(self.setup, dtype, self.device)  # bitsandbytes quantizes while loading
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw, **load)
        if not load:  # a bitsandbytes model is placed by device_map and refuses .to()
            self.model.to(self.device)
        self.model.eval().requires_grad_(False)  # scoring never needs gradients
        if self.setup.checkpoint:
            # one forward first: compressed-tensors decompresses on it, and the ledger must see
            # the layers as they are resident while scoring, not as they were read from disk
            came = hf_quant.cast_once_decompressed(self.model, dtype)
            with torch.no_grad():
                self.model(input_ids=torch.tensor([[self.tok.bos_token_id or 0]], device=self.device))
            self._quant_info = hf_quant.checkpoint_info(
                self.model, self.setup.checkpoint, self.setup.checkpoint_revision, came[0] if came else None
            )
        else:
            self._quant_info = hf_quant.quantize_weights(self.model, self.setup)
        if kv_cache.emulated(self.setup):  # vLLM's format, rounded in software: said beside its figures
            kv = f"KV cache {self.setup.kv_cache} rounded in software, held at the model's dtype"
            kept = self.setup.boundary_kept_layers(kv_cache.layer_kinds(self.model.config))
            if kept:  # TurboQuant: what vLLM keeps at 16 bits whatever the setup says
                kv += f" (layers {', '.join(map(str, kept))} at 16 bits, as vLLM keeps a TurboQuant cache's boundary)"
            self._quant_info["emulated"] = "; ".join(x for x in (self._quant_info.get("emulated"), kv) if x)
        # what runs, read off the loaded model: the linear modules' storage, attention, the KV cache's layers
        self._quant_info["provenance"] = model_provenance(self.model, self.setup)
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.conv = conventions(self.tok)
        self.max_length = min(self.max_length, getattr(self.model.config, "max_position_embeddings", 10**9))
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._rss_after_load = _rss_bytes()

    def _gguf_alone(self, gguf: Path) -> str:
        """A folder holding only a link to the GGUF file: transformers prefers a tokenizer.json
        (or config.json) lying beside the file to the GGUF's own, and the model's checksum
        covers the file alone, so nothing else may be read with it."""
        import tempfile

        self._gguf_dir = tempfile.TemporaryDirectory(prefix="qeval-gguf-")
        (Path(self._gguf_dir.name) / gguf.name).symlink_to(gguf.resolve())
        return self._gguf_dir.name

    @property
    def quant_info(self) -> dict[str, Any]:
        """What the weight quantizer did (library, scheme, group sizes); empty before load."""
        return self._quant_info

    def close(self) -> None:
        self.model = None
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def library_versions(self) -> dict[str, str]:
        return hf_quant.library_versions(self.setup)

    # -- log-likelihood --------------------------------------------------------------
    @torch.no_grad()
    def loglikelihood(self, requests: list[LoglikelihoodRequest], progress: Progress) -> list[LoglikelihoodResult]:
        """Summed log-prob of each continuation, and whether greedy decoding would produce it.

        Requests sharing a context (the choices of one question) share one prefill of it. With
        an unquantized KV cache the prefill runs the whole context and its last position scores
        every continuation's first token (a one-token answer needs no second pass); the rest of
        each longer continuation is scored in a second pass over the prefill's cache rows,
        repeated per continuation. With a quantized KV cache every request gets its own prefill
        of ctx[:-1] (quantized caches cannot be row-selected) and its second pass scores
        [ctx[-1]] + cont[:-1], so that every scored position attends to K/V that came out of
        the quantized cache.
        """
        pairs = encoded_requests(self.conv, requests, self.max_length)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (ctx, _) in enumerate(pairs):
            key = tuple(ctx) if not self.setup.quantizes_kv else (*ctx, -1 - i)  # -1-i: never shared
            groups.setdefault(key, []).append(i)
        # unquantized cache: contexts of like length share a prefill (the second pass re-groups the
        # continuations by length); quantized: one pass covers context end and continuation, sort by both
        fresh = not self.setup.quantizes_kv
        order = sorted(
            groups.values(),
            key=lambda ids: (
                (-len(pairs[ids[0]][0]), -max(len(pairs[i][1]) for i in ids))
                if fresh
                else -len(pairs[ids[0]][0]) - max(len(pairs[i][1]) for i in ids)
            ),
        )
        # a reference covers exactly the continuation's tokens, or it is not used (no KL for that request)
        refs = [r.reference(len(cont)) for r, (_, cont) in zip(requests, pairs, strict=True)]
        out: list[LoglikelihoodResult | None] = [None] * len(pairs)
        for chunk in self._chunks(order, pairs):
            ids = [i for g in chunk for i in g]
            for i, span in zip(ids, self._score_shared(chunk, pairs, refs), strict=True):
                out[i] = span.result()
            progress(len(ids))
        return out  # type: ignore[return-value]

    def _chunks(self, order: list[list[int]], pairs: list[tuple[list[int], list[int]]]) -> Iterator[list[list[int]]]:
        """Up to batch_size contexts per prefill, and no more tokens in the second pass's cache
        rows (context x continuations) than batch_size full-length sequences hold."""
        budget = self.batch_size * self.max_length
        chunk: list[list[int]] = []
        tokens = 0
        for ids in order:
            cost = len(pairs[ids[0]][0]) * len(ids)
            if chunk and (len(chunk) >= self.batch_size or tokens + cost > budget):
                yield chunk
                chunk, tokens = [], 0
            chunk.append(ids)
            tokens += cost
        if chunk:
            yield chunk

    def _score_shared(
        self, chunk: list[list[int]], pairs: list[tuple[list[int], list[int]]], refs: list[np.ndarray | None]
    ) -> list[_Span]:
        """Per request of the chunk: the continuation's scored positions (`_Span`)."""
        fresh = not self.setup.quantizes_kv  # scored positions may attend to K/V computed in the same pass
        reqs = [(r, pairs[i]) for r, g in enumerate(chunk) for i in g]
        ref_of = [refs[i] for g in chunk for i in g]
        cache, p_mask, last = self._prefill(
            [pairs[g[0]][0] if fresh else pairs[g[0]][0][:-1] for g in chunk], keep_last=fresh
        )
        first = (
            [
                _span(F.log_softmax(last[r].float(), -1)[None], cont[:1], None if ref is None else ref[:1])
                for (r, (_, cont)), ref in zip(reqs, ref_of, strict=True)
            ]
            if fresh
            else []
        )
        second = [k for k, (_, (_, cont)) in enumerate(reqs) if len(cont) > 1 or not fresh]
        inputs = {
            k: cont[:-1] if fresh else ctx[-1:] + cont[:-1] for k, (_, (ctx, cont)) in ((k, reqs[k]) for k in second)
        }
        rests = self._score_rest(
            cache,
            p_mask,
            len(chunk),
            [reqs[k] for k in second],
            [ref_of[k] for k in second],
            [inputs[k] for k in second],
            fresh,
        )
        rest_of = dict(zip(second, rests, strict=True))
        return [
            _Span.join(([first[k]] if fresh else []) + ([rest_of[k]] if k in rest_of else [])) for k in range(len(reqs))
        ]

    def _score_rest(
        self,
        cache: Any,
        p_mask: torch.Tensor,
        n_rows: int,
        reqs: list[tuple[int, tuple[list[int], list[int]]]],
        refs: list[np.ndarray | None],
        inputs: list[list[int]],
        fresh: bool,
    ) -> list[_Span]:
        """The continuation positions the prefill's last logits do not score, per request (`reqs`:
        its cache row and its (context, continuation); `inputs`: the tokens run after the prefill).

        The continuations' lengths vary (HellaSwag's endings: 5 to 40 tokens): one pass over all of
        them pads each to the longest, which doubled the tokens run; passes over rows of like
        length, each on a copy of its cache rows, run about what is real. Quantized caches cannot
        be row-selected: their rows are the chunk's own, one pass. No pass returns more logits
        than LOGITS_BUDGET_BYTES (float32 over the vocabulary at every padded position)."""
        vocab = getattr(self.model.config, "vocab_size", None) or len(self.tok)
        max_tokens = max(1, LOGITS_BUDGET_BYTES // (4 * vocab))
        lengths = [len(x) for x in inputs]
        subs = _sub_batches(lengths, SUB_BATCH_OVERHEAD, max_tokens) if fresh else [range(len(reqs))]
        out: dict[int, _Span] = {}
        for sub in subs:
            ks = list(sub)
            rows = torch.tensor([reqs[k][0] for k in ks])
            part = cache if len(subs) == 1 else copy.deepcopy(cache)
            if len(rows) != n_rows or not torch.equal(rows, torch.arange(n_rows)):
                part.batch_select_indices(rows.to(self.device))
            logits = self._extend(part, p_mask[rows], [inputs[k] for k in ks])
            for row, k in enumerate(ks):
                cont, ref = reqs[k][1][1], refs[k]
                out[k] = _span(
                    F.log_softmax(logits[row, : len(cont) - fresh].float(), -1),
                    cont[fresh:],
                    None if ref is None else ref[fresh:],
                )
        return [out[k] for k in range(len(reqs))]

    def _extend(self, cache: Any, mask: torch.Tensor, inputs: list[list[int]]) -> torch.Tensor:
        """The logits of `inputs` (right-padded) run after the prefill's rows in `cache`, whose
        prefix mask is `mask`."""
        r_ids, r_mask = _pad(inputs, self.tok.pad_token_id, left=False)
        pos = mask.sum(1, keepdim=True) + torch.arange(r_ids.shape[1]).unsqueeze(0)
        return self._cached_pass(r_ids, torch.cat([mask, r_mask], 1), pos, cache).logits

    def _cached_pass(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any, **kw: Any) -> Any:
        """One forward pass of padded rows that extends `cache` (ids, mask and positions moved to
        the model's device); `kw`: more of the model's arguments (logits_to_keep)."""
        return self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=pos.to(self.device),
            past_key_values=cache,
            use_cache=True,
            **kw,
        )

    def _prefill(
        self, prefixes: list[list[int]], keep_last: bool = False, share: bool = True
    ) -> tuple[Any, torch.Tensor, Any]:
        """Left-padded prefill into a fresh cache: the cache, the prefix mask, and (keep_last)
        the logits of each row's last position. Only those are computed (logits_to_keep=1):
        the full-vocabulary logits of every prefix position are never needed.

        With an unquantized KV cache, a token prefix all rows share (the few-shot examples of
        an MMLU subject, which lm-eval draws `first_n`) is run once and its cache rows
        repeated; each row's own tokens follow it, padded in between."""
        cache = kv_cache.new_cache(self.model.config, self.setup)
        shared = 0 if not share or self.setup.quantizes_kv or len(prefixes) < 2 else _common_prefix(prefixes)
        if shared < MIN_SHARED_PREFIX:
            shared = 0
        else:
            head = torch.tensor([prefixes[0][:shared]], device=self.device)
            self.model(input_ids=head, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(len(prefixes))
        ids, mask = _pad([p[shared:] for p in prefixes], self.tok.pad_token_id, left=True)
        last = None
        if ids.shape[1]:
            pos = shared + (mask.cumsum(1) - 1).clamp(min=0)
            mask = torch.cat([torch.ones(len(prefixes), shared, dtype=mask.dtype), mask], 1)
            out = self._cached_pass(ids, mask, pos, cache, logits_to_keep=1)
            last = out.logits[:, -1] if keep_last else None
        return cache, mask, last

    # -- rolling log-likelihood (perplexity) -------------------------------------------
    @torch.no_grad()
    def loglikelihood_rolling(self, requests: list[RollingRequest], progress: Progress) -> list[RollingResult]:
        """Per-token log-probs of whole texts, with top-k next-token distributions.

        Windows of all texts are batched together (right-padded). With a quantized KV
        cache, K/V pass through its quantizer before attention (`kv_cache.round_trip_cache`),
        which equals token-by-token decoding at the cost of one forward pass.
        """
        windows = []  # (request index, offset of the window's first predicted token, ctx, pred)
        for r, req in enumerate(requests):
            offset = 0
            for ctx, pred in rolling_windows(self.conv.encode(req.text), self.conv.prefix_token_id, self.max_length):
                windows.append((r, offset, ctx, pred))
                offset += len(pred)
        parts: list[list[tuple[int, tuple[np.ndarray, ...]]]] = [[] for _ in requests]
        long = [w for w in windows if len(w[2]) + len(w[3]) - 1 > self.chunk]
        for r, offset, ctx, pred in long:  # one at a time, in chunks (hf/chunked.py)
            parts[r].append((offset, self._score_long(ctx, pred, requests[r].ref_indices, offset)))
            progress(1)
        windows = [w for w in windows if len(w[2]) + len(w[3]) - 1 <= self.chunk]
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i][2]) - len(windows[i][3]))
        for start in range(0, len(order), self.batch_size):
            batch = [windows[i] for i in order[start : start + self.batch_size]]
            inputs = [(ctx + pred)[:-1] for _, _, ctx, pred in batch]
            ids, mask = _pad(inputs, self.tok.pad_token_id, left=False)
            # quantized KV: every K/V goes through the cache's quantizer before attention
            cache = kv_cache.round_trip_cache(self.model.config, self.setup) if self.setup.quantizes_kv else None
            logits = self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                past_key_values=cache,
                use_cache=cache is not None,
            ).logits
            for row, (r, offset, _, pred) in enumerate(batch):
                span = logits[row, len(inputs[row]) - len(pred) : len(inputs[row])]
                ref = requests[r].ref_indices
                ref = None if ref is None else ref[offset : offset + len(pred)]
                parts[r].append((offset, _window_stats(span, pred, ref)))
            progress(len({w[0] for w in batch}))
        return [
            _assemble(sorted(p, key=lambda x: x[0]), req.ref_indices is not None)
            for p, req in zip(parts, requests, strict=True)
        ]

    def _score_long(
        self, ctx: list[int], pred: list[int], ref: np.ndarray | None, offset: int
    ) -> tuple[np.ndarray, ...]:
        """One long window, chunked: the same arrays `_window_stats` gives for a short one."""
        ref = None if ref is None else ref[offset : offset + len(pred)]

        def stats(logits: torch.Tensor, at: int) -> tuple[np.ndarray, ...]:
            n = logits.shape[0]
            return _window_stats(logits, pred[at : at + n], None if ref is None else ref[at : at + n])

        pieces = chunked.score_chunked(
            self.model, self.setup, (ctx + pred)[:-1], len(pred), self.chunk, stats, self.device
        )
        return tuple(np.concatenate([p[k] for p in pieces]) for k in range(4))

    # -- generation --------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, requests: list[GenerateRequest], progress: Progress) -> list[str]:
        """Generation until a stop string or max_gen_toks, batched with left padding: greedy, or
        sampled where a request carries `sampling` (its own seeded stream: hf/sampling.py).

        Rows are decoded `generation_batch_size` at a time (default 4 x batch_size): a decode
        step reads every weight once whatever the rows, so more rows per step cost little and
        save whole passes over the weights."""
        encoded = [self.conv.prompt(r.context) for r in requests]
        out: list[str] = [""] * len(requests)
        for i, r in enumerate(requests):  # long prompts: one at a time, chunked prefill (hf/chunked.py)
            ctx = generation_context(encoded[i], self.max_length, r.max_gen_toks)
            if len(ctx) > self.chunk:
                if r.sampling is not None:
                    raise ValueError(
                        f"sampled generation of a {len(ctx)}-token prompt: prompts past the chunked "
                        f"path's {self.chunk} tokens are decoded greedily only on transformers"
                    )
                tokens = chunked.greedy_chunked(
                    self.model,
                    self.setup,
                    self.from_cache,
                    ctx,
                    r.max_gen_toks,
                    self.chunk,
                    self.device,
                    lambda g, t, r=r: self._stops(g, t, r),  # type: ignore[misc]
                )
                out[i] = Generation(_cut(self.tok.decode(tokens, skip_special_tokens=True), r.until), len(tokens))
                progress(1)
        short = [
            i
            for i, r in enumerate(requests)
            if len(generation_context(encoded[i], self.max_length, r.max_gen_toks)) <= self.chunk
        ]
        order = sorted(short, key=lambda i: -len(encoded[i]))
        for start in range(0, len(order), self.gen_batch_size):
            idx = order[start : start + self.gen_batch_size]
            reqs = [requests[i] for i in idx]
            max_new = max(r.max_gen_toks for r in reqs)
            ctxs = [generation_context(encoded[i], self.max_length, max_new) for i in idx]
            for i, text in zip(idx, self._greedy(ctxs, reqs, max_new), strict=True):
                out[i] = text
            progress(len(idx))
        return out

    def _greedy(self, ctxs: list[list[int]], reqs: list[GenerateRequest], max_new: int) -> list[str]:
        """Decode from a prefilled cache. In a run without a KV setup: the prefill's last position
        gives the first token, rows share a common prefix, and a row that has finished leaves the
        batch (its compute is not spent on padding until the slowest row stops). Where a setup
        quantizes KV (`from_cache`, every setup of that run): the last context token is fed from
        the cache like every later one, so each generated token is predicted from K/V that came
        out of the cache, and no prefix is shared or row dropped (quantized caches cannot drop
        rows: finished rows ride along), so that the baseline is decoded as the KV setups are."""
        fresh = not self.from_cache
        cache, mask, last = self._prefill(ctxs if fresh else [c[:-1] for c in ctxs], keep_last=fresh, share=fresh)
        pos = mask.sum(1, keepdim=True)
        generated: list[list[int]] = [[] for _ in ctxs]
        done = [False] * len(ctxs)
        rows = list(range(len(ctxs)))  # the original row of each batch row
        step = None if fresh else torch.tensor([[c[-1]] for c in ctxs])
        streams = [hf_sampling.generator(r.sampling) for r in reqs]  # one per row, whatever the batch
        for _ in range(max_new):
            if step is not None:
                mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], 1)
                last = self._cached_pass(step, mask, pos, cache).logits[:, -1]
                pos = pos + 1
            nxt = hf_sampling.next_tokens(last, [reqs[row].sampling for row in rows], [streams[row] for row in rows])
            for b, token in enumerate(nxt.tolist()):
                row = rows[b]
                if not done[row]:
                    generated[row].append(token)
                    done[row] = self._stops(generated[row], token, reqs[row])
            if all(done):
                break
            keep = [b for b, row in enumerate(rows) if not done[row]] if fresh else list(range(len(rows)))
            if len(keep) < len(rows):
                index = torch.tensor(keep)
                cache.batch_select_indices(index.to(self.device))
                mask, pos, nxt, rows = mask[index], pos[index], nxt[index], [rows[b] for b in keep]
            step = nxt[:, None]
        return [
            Generation(_cut(self.tok.decode(g, skip_special_tokens=True), r.until), len(g))
            for g, r in zip(generated, reqs, strict=True)
        ]

    def _stops(self, generated: list[int], token: int, req: GenerateRequest) -> bool:
        """EOS, a stop string in the decoded text, or max_gen_toks reached."""
        if token == self.tok.eos_token_id or len(generated) >= req.max_gen_toks:
            return True
        return any(s in self.tok.decode(generated, skip_special_tokens=True) for s in req.until)

    # -- memory ------------------------------------------------------------------------
    @torch.no_grad()
    def memory(self) -> dict[str, MemoryFigure]:
        """Measured ledger figures, each with its source."""
        figures = {
            "weights_bytes": MemoryFigure(
                model_weights_bytes(self.model), "sum of loaded tensor bytes (quantized data, scales, zero points)"
            ),
            "kv_bytes_per_token": MemoryFigure(
                self._measure_kv_per_token(), "bytes held by the cache object after a 64-token prefill"
            )
            if not kv_cache.emulated(self.setup)
            else MemoryFigure(None, "not measured: the emulated format's values are held at the model's dtype"),
        }
        sequence = None if kv_cache.emulated(self.setup) else self._measure_sequence()
        if sequence is not None:
            figures["kv_bytes_per_sequence"] = sequence
        rss_peak = _peak_rss_bytes()
        if self.device == "cuda":
            figures["peak_bytes"] = MemoryFigure(
                int(torch.cuda.max_memory_allocated()),
                "torch.cuda.max_memory_allocated",
                reserved_peak=int(torch.cuda.max_memory_reserved()),
            )
            figures["activations_bytes"] = MemoryFigure(
                int(torch.cuda.max_memory_allocated()) - figures["weights_bytes"].measured,  # type: ignore[operator]
                "CUDA allocator peak minus weights (activations and KV cache of the scoring batches)",
            )
            figures["overhead_bytes"] = MemoryFigure(
                int(torch.cuda.max_memory_reserved() - torch.cuda.max_memory_allocated()),
                "CUDA reserved peak minus allocated peak (allocator slack; the CUDA context is not included)",
            )
        else:
            figures["peak_bytes"] = MemoryFigure(rss_peak, "process peak RSS (getrusage ru_maxrss)")
            figures["activations_bytes"] = MemoryFigure(
                max(rss_peak - self._rss_after_load, 0),
                "RSS peak minus RSS after load (activations, KV cache and allocator growth while scoring)",
            )
        return figures

    # -- performance -------------------------------------------------------------------
    @property
    def concurrency_limit(self) -> int | None:
        return None  # a batch is as large as memory allows

    def performance(self, workload: Workload) -> Measurement:
        """Batched prefill and greedy decode on the setup's own cache (qeval/backends/hf/perf.py)."""
        from qeval.backends.hf import perf as perf_hf

        return perf_hf.measure(
            self.model, self.tok, lambda: kv_cache.new_cache(self.model.config, self.setup), self.device, workload
        )

    def _measure_sequence(self) -> MemoryFigure | None:
        """Where layers keep different spans of tokens (sliding windows, chunks) or hold a state:
        the storage the cache pins for one sequence of the budget's context, after its prefill and
        one decode step (the step that trims a sliding layer's storage to its window). None for a
        uniform model (KV per token x context is exact there) or a context past the model's."""
        from qeval.model.shape import ModelShape

        try:
            shape = ModelShape.from_config(self.model.config.to_dict())
        except ValueError:
            return None
        n = self.cfg.budget.context_len
        if shape.uniform or n > self.cfg.model.max_context or n < 2:
            return None
        ids = torch.randint(0, min(self.model.config.vocab_size, 1000), (1, n - 1), device=self.device)
        cache = kv_cache.new_cache(self.model.config, self.setup)
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
        self.model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True)
        return MemoryFigure(
            cache_storage_bytes(cache),
            f"storage the cache pins after a {n - 1}-token prefill and one "
            "decode step (one sequence of budget.context_len)",
            context=n,
        )

    def _measure_kv_per_token(self, n: int = 64) -> int:
        ids = torch.randint(0, min(self.model.config.vocab_size, 1000), (1, n), device=self.device)
        cache = kv_cache.new_cache(self.model.config, self.setup)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True)
        return cache_bytes(cache) // n


def _weights_dtype(setup: Setup) -> str:
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[setup.weights or "bf16"]


#: windows and prompts longer than this many tokens are scored one at a time, in chunks of it
LONG_CHUNK = 1024
#: a prefix shared by every row of a prefill is run once when at least this long
MIN_SHARED_PREFIX = 16


#: a forward pass's fixed cost in tokens' worth of work (dispatch over every layer, a GEMM too
#: thin to reach its rate): what splitting a second pass into passes of like-length rows must save
SUB_BATCH_OVERHEAD = 64
#: the most full-vocabulary logits one second pass may produce, in bytes: a pass returns float32
#: logits at every position of every row (64 HellaSwag endings x 40 tokens x 49,152 ids is 500 MB),
#: and that one tensor set the worker's peak RSS, higher the longer the batch the data happened to
#: hold; passes capped at this keep the peak bounded whatever the documents (docs/history.md, "Memory at scale")
LOGITS_BUDGET_BYTES = 128 * 2**20


def _sub_batches(lengths: list[int], overhead: int, max_tokens: int | None = None) -> list[list[int]]:
    """Indices of `lengths` in groups whose passes, each padded to its longest row, cost the
    least: sum over groups of (overhead + rows x longest), exact by dynamic programming over the
    lengths sorted longest first (a best grouping is always contiguous there). With `max_tokens`,
    no group pads to more than that many positions (rows x longest), unless one row alone does."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            padded = (j - i) * lengths[order[i]]
            if max_tokens is not None and padded > max_tokens and j - i > 1:
                continue  # over the logits budget: never a choice while a smaller group is one
            cost = best[i] + overhead + padded
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def _common_prefix(seqs: list[list[int]]) -> int:
    """Length of the token prefix all sequences share, leaving each at least one token."""
    n = min(len(s) for s in seqs) - 1
    first = seqs[0]
    for i in range(max(n, 0)):
        if any(s[i] != first[i] for s in seqs[1:]):
            return i
    return max(n, 0)


@dataclass
class _Span:
    """Scored positions of one continuation: each actual token's log-prob, whether all are the
    argmax, this model's top-k, and the log-probs at the reference's ids (None: no reference)."""

    tok: np.ndarray
    greedy: bool
    top_i: np.ndarray
    top_l: np.ndarray
    ref_l: np.ndarray | None

    @staticmethod
    def join(parts: list[_Span]) -> _Span:
        refs = [p.ref_l for p in parts]
        return _Span(
            np.concatenate([p.tok for p in parts]),
            all(p.greedy for p in parts),
            np.concatenate([p.top_i for p in parts]),
            np.concatenate([p.top_l for p in parts]),
            None if any(r is None for r in refs) else np.concatenate(refs),  # type: ignore[arg-type]
        )

    def result(self) -> LoglikelihoodResult:
        return LoglikelihoodResult(
            float(self.tok.sum(dtype=np.float64)),
            self.greedy,
            len(self.tok),
            self.tok,
            self.top_i,
            self.top_l,
            self.ref_l,
        )


def _span(logp: torch.Tensor, cont: list[int], ref: np.ndarray | None) -> _Span:
    """`_Span` of the positions `logp` ([n, vocab], log-softmaxed) scores, n = len(cont)."""
    target = torch.tensor(cont, device=logp.device)
    greedy = bool((logp.argmax(-1) == target).all())
    top_l, top_i = logp.topk(min(TOPK, logp.shape[-1]), dim=-1)
    ref_l = (
        logp.gather(1, torch.as_tensor(ref, dtype=torch.long, device=logp.device)).cpu().numpy()
        if ref is not None
        else None
    )
    return _Span(
        logp.gather(1, target[:, None])[:, 0].cpu().numpy(),
        greedy,
        top_i.cpu().numpy().astype(np.int32),
        top_l.cpu().numpy(),
        ref_l,
    )


def _pad(seqs: list[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        if not s:
            continue
        sl = slice(width - len(s), width) if left else slice(0, len(s))
        ids[row, sl] = torch.tensor(s)
        mask[row, sl] = 1
    return ids, mask


def _window_stats(span: torch.Tensor, pred: list[int], ref: np.ndarray | None) -> tuple[np.ndarray, ...]:
    logp = F.log_softmax(span.float(), dim=-1)
    top_l, top_i = logp.topk(min(TOPK, logp.shape[-1]), dim=-1)
    tok = logp.gather(1, torch.tensor(pred, device=logp.device)[:, None])[:, 0]
    ref_l = (
        logp.gather(1, torch.as_tensor(ref, dtype=torch.long, device=logp.device)) if ref is not None else top_l[:, :0]
    )
    return tuple(t.cpu().numpy() for t in (tok, top_i, top_l, ref_l))


def _assemble(parts: list[tuple[int, tuple[np.ndarray, ...]]], with_ref: bool) -> RollingResult:
    cols = [np.concatenate([p[1][k] for p in parts]) for k in range(4)]
    return RollingResult(cols[0], cols[1].astype(np.int32), cols[2].astype(np.float32), cols[3] if with_ref else None)


def _cut(text: str, until: tuple[str, ...]) -> str:
    for stop in until:
        if stop and stop in text:
            text = text.split(stop)[0]
    return text


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB
