"""Make one quantized checkpoint with llm-compressor. Runs in the quantize environment
(.venv-quant, `make quant`), never in qeval's own: llm-compressor 0.14 pins transformers
<=5.17 and compressed-tensors 0.19, vLLM 0.32 pins compressed-tensors 0.17, so the two meet
only through the checkpoint files.

    python -P qeval/quantize/worker.py JOB.json

`-P` keeps this file's folder off sys.path (qeval's module names must not shadow others);
the script imports nothing from qeval. The job (written by qeval/quantize.py) names the model,
the recipe, the calibration texts (or a hub dataset) and the folder to write. Written against
llmcompressor 0.14.0.1 (`oneshot`, `GPTQModifier`, `QuantizationModifier`,
`llmcompressor.modifiers.transform`'s `SmoothQuantModifier` and `AWQModifier`).
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any


def _recipe(spec: dict[str, Any]) -> list[Any]:
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform import AWQModifier, SmoothQuantModifier

    preset = spec["scheme"]
    quant: dict[str, Any] = {"targets": [spec["targets"]], "ignore": spec["ignore"]}
    group = spec.get("group_size")
    if group is not None and group != PRESET_SCHEMES[preset]["weights"].group_size:
        # the presets quantize int4 weights in groups of 128; another size needs the scheme spelled out
        args = {
            k: v.model_copy(update={"group_size": group}) if k == "weights" else v
            for k, v in PRESET_SCHEMES[preset].items()
        }
        quant["config_groups"] = {"group_0": QuantizationScheme(targets=[spec["targets"]], **args)}
    else:
        quant["scheme"] = preset
    if spec["method"] == "awq":  # AWQ rescales channels; the quantization modifier then rounds
        return [AWQModifier(), QuantizationModifier(**quant)]
    if spec.get("rtn"):  # the FP8 / FP4 presets: round to nearest, as llm-compressor's examples make them
        return [QuantizationModifier(**quant)]
    recipe: list[Any] = []
    if "smoothing_strength" in spec:
        recipe.append(SmoothQuantModifier(smoothing_strength=spec["smoothing_strength"]))
    return recipe + [GPTQModifier(**quant)]


def _calibration(job: dict[str, Any], tok: Any) -> tuple[Any, int]:
    """The tokenized calibration set (a `datasets.Dataset`) and how many documents it has."""
    from datasets import Dataset, load_dataset

    texts = job["texts"]
    if texts is None:  # a hub dataset: loaded here, where `datasets` lives
        cal = job["calibration"]
        ds = load_dataset(cal["dataset"], cal["dataset_config"], split=cal["split"], revision=cal["revision"])
        texts = [r[cal["text_field"]] for r in ds.select(range(min(len(ds), job["recipe"]["num_samples"])))]
    enc = [tok(t, add_special_tokens=True, truncation=True, max_length=job["recipe"]["max_seq_length"]) for t in texts]
    return Dataset.from_dict(
        {"input_ids": [e["input_ids"] for e in enc], "attention_mask": [e["attention_mask"] for e in enc]}
    ), len(texts)


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(job["seed"])
    started = time.time()
    m = job["model"]
    tok = AutoTokenizer.from_pretrained(m["path"], revision=m["revision"], trust_remote_code=m["trust_remote_code"])
    model = AutoModelForCausalLM.from_pretrained(
        m["path"], revision=m["revision"], dtype=m["dtype"], trust_remote_code=m["trust_remote_code"]
    )
    out = Path(job["output"])
    calibrated = "num_samples" in job["recipe"]  # dynamic and weight-only recipes read no text
    dataset, n_texts = _calibration(job, tok) if calibrated else (None, 0)
    # shuffle off: the first N documents, every time, so a checkpoint is reproducible
    data: dict[str, Any] = {}
    if dataset is not None:
        data = {
            "dataset": dataset,
            "max_seq_length": job["recipe"]["max_seq_length"],
            "num_calibration_samples": n_texts,
            "shuffle_calibration_samples": False,
        }
    oneshot(model=model, recipe=_recipe(job["recipe"]), output_dir=str(out), **data)
    tok.save_pretrained(out)
    info = {
        "seconds": round(time.time() - started, 1),
        "calibration_texts": n_texts,
        "calibration_tokens": int(sum(len(x) for x in dataset["input_ids"])) if dataset is not None else 0,
        "libraries": {d: version(d) for d in ("llmcompressor", "compressed-tensors", "transformers", "torch")},
    }
    (out / "worker-info.json").write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
