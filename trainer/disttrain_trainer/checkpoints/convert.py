"""`python -m disttrain_trainer.checkpoints.convert --trust PATH...`: checkpoints of an older disttrain
rewritten in the form that is read back safely (safe_state.py), for checkpoints you trust.

disttrain before safe checkpoints pickled numpy's RNG state (and PowerSGD's numpy generator) into
state.pt and extra.pt; those files are refused now, because reading them needs an unpickler that
runs whatever the file names. This command is that unpickler, run once, by you, on files you
vouch for (hence `--trust`): it loads each state.pt / extra.pt fully, turns numpy values into plain
ones (generator states into lists, arrays into tensors, scalars into numbers), writes the file back
(atomically) and brings meta.json's manifest (format 2) and a commit marker lying beside the step
(`step-N.committed`, as `aws s3 sync` of an old bucket prefix leaves it) up to the new sizes.

PATH: a checkpoint (`step-N/`) or a folder of them (a job's checkpoint directory, or a synced copy
of its bucket prefix).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import directory as cdir
from . import safe_state
from .rank_state import numpy_state
from .sharded import EXTRA_FILE
from .whole import FORMAT, STATE_FILE

_STEP = re.compile(r"^step-\d{8,}$")


def plain_numpy(obj: Any) -> Any:
    """`obj` with numpy values made plain: generator states (a RandomState, or the tuple
    np.random.get_state() returns) as numpy_state's lists, other arrays as tensors, scalars as numbers."""
    if isinstance(obj, np.random.RandomState):
        return numpy_state(obj.get_state())
    if isinstance(obj, tuple) and len(obj) == 5 and obj[0] == "MT19937" and isinstance(obj[1], np.ndarray):
        return numpy_state(obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return type(obj)((k, plain_numpy(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        items = [plain_numpy(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def convert_file(path: Path) -> bool:
    """Rewrite one trusted torch file in the safe form; False when it already was."""
    try:
        safe_state.load(path)
        return False
    except safe_state.UnsafeCheckpoint:
        pass
    state = plain_numpy(torch.load(path, map_location="cpu", weights_only=False))  # --trust: the user vouches for it
    tmp = path.with_name(f".{path.name}.converting")
    torch.save(safe_state.plain(state), tmp)
    safe_state.load(tmp)  # what a resume will do
    os.replace(tmp, path)
    return True


def convert_step(step: Path) -> list[str]:
    """Convert checkpoint `step` in place; the files rewritten."""
    done = [f.name for f in (step / STATE_FILE, step / EXTRA_FILE) if f.is_file() and convert_file(f)]
    meta = cdir.read_meta(step)
    if done and meta is not None:
        files = cdir.manifest(step)
        meta.update(files=files, bytes=files.get(STATE_FILE, meta.get("bytes", 0)))
        if meta.get("format") in (None, 1):
            meta["format"] = FORMAT
        (step / cdir.META_FILE).write_text(json.dumps(meta))
    marker = step.parent / f"{step.name}.committed"
    if done and marker.is_file():
        body = json.loads(marker.read_text())
        body["files"] = {**body.get("files", {}), **{n: (step / n).stat().st_size for n in body.get("files", {})
                                                     if (step / n).is_file()}}  # fmt: skip
        marker.write_text(json.dumps(body))
    return done


def steps_under(path: Path) -> list[Path]:
    if _STEP.match(path.name):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and _STEP.match(p.name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m disttrain_trainer.checkpoints.convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--trust", action="store_true", help="you vouch for these files: they are unpickled in full")
    p.add_argument("paths", nargs="+", type=Path)
    args = p.parse_args(argv)
    if not args.trust:
        print("refusing: converting unpickles each file in full, which runs whatever code it names; pass --trust "
              "for checkpoints you wrote yourself", file=sys.stderr)  # fmt: skip
        return 2
    for path in args.paths:
        steps = steps_under(path)
        if not steps:
            print(f"{path}: no step-N checkpoint here", file=sys.stderr)
            return 2
        for step in steps:
            done = convert_step(step)
            print(f"{step}: {'converted ' + ', '.join(done) if done else 'already safe'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
