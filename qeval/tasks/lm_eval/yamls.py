"""lm-eval task YAMLs made independent of where qeval runs: each `include_path` folder is copied
into a private folder and its YAMLs rewritten so that

- `include: lm_eval/<path>` points into the installed lm-evaluation-harness's task library
  (lm-eval itself has no include by name; a path into site-packages would tie the file to one
  virtualenv), and any other relative `include:` is made absolute;
- relative `dataset_kwargs.data_files` resolve against the YAML's own folder (lm-eval's
  `datasets` resolves them against the working directory), and every data file must lie inside
  its include folder, or inside a folder the config lists in `lm_eval.data_dirs`;
- a relative `include:` of another YAML in the folder (a `_base.yaml`) points at that YAML's
  rewritten copy, so the base's own includes and data files are rewritten too;
- a task the qeval config gives data overrides (`dataset_path`, `dataset_name`,
  `dataset_kwargs`) carries them; a built-in task with overrides gets a YAML of its own that
  `include`s the built-in one.

`!function` tags are kept as they are: a folder on `include_path` may run Python, exactly as it
does under lm-eval, so point it only at folders you trust.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from qeval.errors import UserError
from qeval.files.yaml import MAX_YAML_BYTES, MAX_YAML_NODES, expanded_size

LM_EVAL_PREFIX = "lm_eval/"


class _Function(str):
    """A `!function module.name` value, kept as written."""


class _Loader(yaml.SafeLoader):
    pass


class _Dumper(yaml.SafeDumper):
    pass


_Loader.add_constructor("!function", lambda loader, node: _Function(loader.construct_scalar(node)))
_Dumper.add_representer(_Function, lambda dumper, value: dumper.represent_scalar("!function", str(value)))


def tasks_root() -> Path:
    """The installed lm-eval's task library (lm_eval/tasks)."""
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).resolve().parent


def read_task_yaml(path: Path) -> dict[str, Any]:
    """A task or group YAML, bounded like every YAML qeval reads."""
    if path.stat().st_size > MAX_YAML_BYTES:
        raise UserError(f"{path}: over the {MAX_YAML_BYTES:,}-byte limit for a YAML file")
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: invalid lm-eval task YAML: {str(exc).splitlines()[0]}") from None
    if expanded_size(doc) > MAX_YAML_NODES:
        raise UserError(f"{path}: YAML expands to more than {MAX_YAML_NODES:,} nodes (an alias bomb?)")
    return doc if isinstance(doc, dict) else {}


def materialize(
    include_paths: list[Path], overrides: dict[str, dict[str, Any]], out: Path, data_dirs: list[Path] | None = None
) -> Path:
    """Copy and rewrite every include path into `out` (see the module docstring); returns `out`.
    A YAML's data files must lie inside its include folder, or inside one of `data_dirs`."""
    data_dirs = [d.resolve() for d in data_dirs or []]
    pending = dict(overrides)
    for src in include_paths:
        if not src.is_dir():
            raise UserError(f"lm_eval.include_path {src}: not a folder")
    check_distinct_names(include_paths)
    for i, src in enumerate(include_paths):
        dest = out / f"{i:02d}-{src.name}"
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "data"))
        roots = (src.resolve(), dest.resolve())
        for copy in sorted(dest.rglob("*.yaml")):
            original = src / copy.relative_to(dest)
            doc = read_task_yaml(original)
            name = doc.get("task") if isinstance(doc.get("task"), str) else None
            doc = _rewrite(doc, original.parent, roots, data_dirs) | (pending.pop(name, {}) if name else {})
            copy.write_text(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True))
    for name, extra in pending.items():  # built-in tasks with data overrides
        folder = out / "zz-overrides"
        folder.mkdir(parents=True, exist_ok=True)
        doc = {"include": str(builtin_yaml(name)), "task": name} | extra
        (folder / f"{name}.yaml").write_text(yaml.dump(doc, Dumper=_Dumper, sort_keys=False))
    return out


def check_distinct_names(include_paths: list[Path]) -> None:
    """Refuse a task or group name that two include folders define: lm-eval would score the
    first folder's and ignore the other without a word."""
    defined_in: dict[str, Path] = {}
    for folder in dict.fromkeys(include_paths):  # a folder listed twice is the same definitions
        for name in local_names(folder):
            if name in defined_in:
                raise UserError(
                    f"lm_eval.include_path: task {name!r} is defined in both {defined_in[name]} and "
                    f"{folder}: rename one"
                )
            defined_in[name] = folder


def _rewrite(doc: dict[str, Any], base: Path, roots: tuple[Path, Path], data_dirs: list[Path]) -> dict[str, Any]:
    """One YAML of an include folder made self-contained. `roots`: the include folder and its
    rewritten copy; a relative `include:` inside the folder points at the copy (whose own
    includes and data files are rewritten too: a `_base.yaml` that includes lm_eval/...)."""
    src_root, dest_root = roots
    include = doc.get("include")
    if isinstance(include, str):
        if include.startswith(LM_EVAL_PREFIX):
            target = tasks_root() / include[len(LM_EVAL_PREFIX) :]
        else:
            target = (base / include).resolve()
            if not target.is_relative_to(src_root):  # its data files would escape every check below
                raise UserError(
                    f"{base}: include {include!r} is outside the include folder {src_root} (include "
                    "lm_eval/<path> for lm-eval's own tasks)"
                )
            if target.suffix == ".yaml":
                target = dest_root / target.relative_to(src_root)
        if not target.is_file():
            raise UserError(f"{base}: include {include!r} not found (lm_eval/<path> is resolved in {tasks_root()})")
        doc["include"] = str(target.resolve())
    allowed = [src_root, *data_dirs]
    kwargs = doc.get("dataset_kwargs") or {}
    if isinstance(kwargs, dict):
        for key in ("data_files", "data_dir"):
            if kwargs.get(key) is not None:
                kwargs = dict(kwargs) | {key: _absolute(kwargs[key], base, allowed, folder=key == "data_dir")}
        if kwargs:
            doc["dataset_kwargs"] = kwargs
    path = doc.get("dataset_path")
    if isinstance(path, str) and (
        Path(path).is_absolute() or path.startswith((".", "file:")) or (base / path).exists()
    ):
        doc["dataset_path"] = _absolute(path, base, allowed, folder=True)  # a local dataset folder or script
    return doc


_GLOB = re.compile(r"[*?\[]")


def _absolute(files: Any, base: Path, allowed: list[Path], folder: bool = False) -> Any:
    """Local data paths made absolute (relative ones against the YAML's folder), each confined to
    `allowed`, after symlinks, `file://` and glob matches: a task folder from elsewhere must not
    read /etc/passwd or ../../secrets. Remote URLs (hf://, https://) are left to `datasets`."""
    if isinstance(files, dict):
        return {k: _absolute(v, base, allowed, folder) for k, v in files.items()}
    if isinstance(files, list):
        return [_absolute(v, base, allowed, folder) for v in files]
    if not isinstance(files, str) or ("://" in files and not files.startswith("file://")):
        return files
    raw = files.removeprefix("file://")
    path = Path(os.path.abspath(base / raw))  # an absolute `raw` stays itself; symlinks resolved below
    pattern = bool(_GLOB.search(raw))
    # a glob is confined by its fixed folder and by every file it matches
    checked = [Path(_GLOB.split(str(path))[0]).parent] if pattern else [path]
    matches = [Path(m) for m in glob.glob(str(path), recursive=True)] if pattern else [path]
    for candidate in checked + matches:
        if not any(candidate.resolve().is_relative_to(root) for root in allowed):
            raise UserError(
                f"{base}: data {files} is outside the include folder {allowed[0]} (list its folder in "
                "lm_eval.data_dirs to allow it)"
            )
    if not matches or not pattern and not (path.is_dir() if folder else path.is_file()):
        raise UserError(
            f"{base}: data {'folder' if folder else 'file'} {files} not found (relative paths are "
            "read from the YAML's folder)"
        )
    return str(path)


_NAME_LINE = re.compile(r'^\s*["\']?(task|group)["\']?\s*:\s*["\']?([A-Za-z0-9_\-.]+)["\']?\s*(#.*)?$', re.M)


@lru_cache(maxsize=1)
def _builtin_index() -> dict[str, list[Path]]:
    """{name: YAMLs whose text says `task: name` or `group: name`}: a text scan of lm-eval's task
    library, about a second, where its TaskManager() parses every YAML (10 s here)."""
    index: dict[str, list[Path]] = {}
    for f in sorted(tasks_root().rglob("*.yaml")):
        for m in _NAME_LINE.finditer(f.read_text(errors="replace")):
            index.setdefault(m.group(2), []).append(f)
    return index


def builtin_yaml(name: str) -> Path:
    """The YAML of lm-eval's own task `name` (for data overrides of a built-in task)."""
    for path in _builtin_index().get(name, []):
        doc = read_task_yaml(path)
        if doc.get("task") == name:
            return path
    raise UserError(f"lm-eval task {name!r}: not a task of lm-eval's library (groups take no data overrides)")


def local_names(folder: Path) -> dict[str, tuple[str, Path]]:
    """Tasks and groups the YAMLs of an include folder define: name -> (kind, file)."""
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder of lm-eval task YAMLs")
    out: dict[str, tuple[str, Path]] = {}
    for path in sorted(folder.rglob("*.yaml")):
        doc = read_task_yaml(path)
        for kind in ("group", "task"):
            if isinstance(doc.get(kind), str):
                out[doc[kind]] = (kind, path)
                break
    return out
