"""The run folder: every file a run writes, named in one place.

    runs/NAME/run.json            what ran: toolkit, model, sets, methods, settings (written first)
    runs/NAME/state.npz           accumulators, per-class sums (state.rankK.npz per rank under torchrun)
    runs/NAME/state.examples.K.npz  the example frames of the figures, a file for the K-th set (written when it
                                  takes one)
    runs/NAME/results.json|.csv|.md|.tex   the report, rebuilt from the state by ``segood report``
    runs/NAME/figures/*.png       curves, bars, per-class scores, example panels
"""

import json
from pathlib import Path

from segood.io import as_read_back, exclusive, held

#: the file by which each command's output folder is known, and the command
OUTPUT_FILES = {"run.json": "an evaluation (segood evaluate, score or robustness)",
                "protocol.json": "a protocol (segood protocol)", "attack.json": "an attack (segood attack)"}


def refuse_another_command(folder, own):
    """Refuse ``folder`` where it holds the output of another command than the one whose file is ``own`` (a key of
    :data:`OUTPUT_FILES`): their files would mix."""
    for name, what in OUTPUT_FILES.items():
        if name != own and (Path(folder) / name).exists():
            raise ValueError(f"{folder} holds {what} ({name}); choose another --out")


class RunFolder:
    """Paths of one run folder."""

    def __init__(self, path):
        self.path = Path(path)
        self.run = self.path / "run.json"
        self.results_json = self.path / "results.json"
        self.results_csv = self.path / "results.csv"
        self.results_md = self.path / "results.md"
        self.results_tex = self.path / "results.tex"
        self.figures = self.path / "figures"

    def claimed(self):
        """The folder (made where missing) held by this run alone for the block (a lock file in it, its lock gone
        with the process): a second run into it meanwhile is refused, rather than one replacing the other's
        files."""
        return exclusive(self.path, "segood run", inside=True)

    def in_use(self):
        """Whether a run holds the folder right now (:meth:`claimed`); looks only."""
        return held(self.path, inside=True)

    def state(self, rank=0, world_size=1):
        """The saved evaluation state: one per rank while a sharded run is in flight, then the merged one."""
        return self.path / (f"state.rank{rank}.npz" if world_size > 1 else "state.npz")

    def read_run(self):
        """The run description (run.json); a ValueError naming the folder when it is not a run folder."""
        if self.path.is_file():
            raise ValueError(f"{self.path} is a file, not a run folder: give the folder segood evaluate or segood score "
                             "wrote")
        try:
            run = json.loads(self.run.read_text())
        except FileNotFoundError:
            raise ValueError(f"{self.path} is not a run folder (no {self.run.name}): write one with segood evaluate "
                             "or segood score") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{self.run} is unreadable ({err}); rerun the evaluation into a new folder") from None
        # what the reports read: objects, with an object per set and per method
        if not isinstance(run, dict):
            raise self._damaged("the file")
        for key in ("model", "sets", "methods", "config"):
            if not isinstance(run.get(key), dict):
                raise self._damaged(repr(key))
        for key in ("sets", "methods"):
            name = next((name for name, value in run[key].items() if not isinstance(value, dict)), None)
            if name is not None:
                raise self._damaged(f"{key} {name!r}")
        return run

    def _damaged(self, where):
        return ValueError(f"{self.run} is damaged: {where} is not a JSON object; rerun the evaluation into a new "
                          "folder")

    def refuse_another_run(self, description):
        """Refuse this folder where it holds a different run (another model, sets, methods or settings) than the one
        ``description`` (run.json's content) describes, a file, or the output of another command."""
        if self.path.is_file():
            raise ValueError(f"{self.path} is a file; --out names the folder a run writes")
        refuse_another_command(self.path, self.run.name)
        if not self.run.exists():
            return
        previous = self.read_run()
        config = previous.get("config") or {}  # runs before the float-order grid name num_thresholds: the linear grid
        previous["config"] = {**{k: v for k, v in config.items() if k not in ("num_thresholds", "score_range")},
                              "grid": grid_of_config(config)}
        changed = [difference for key in ("model", "sets", "methods", "config")
                   for difference in _differences(key, as_read_back(previous.get(key)), as_read_back(description[key]))]
        if changed:
            shown = "; ".join(changed[:3]) + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
            raise ValueError(f"{self.path} holds a different run ({shown}: its run.json's, then this run's); the "
                             "same settings continue it, other ones need another folder (--out; in Python out_dir)")

    def read_results(self):
        """The results document (results.json)."""
        try:
            return json.loads(self.results_json.read_text())
        except FileNotFoundError:
            raise ValueError(f"{self.path} has no {self.results_json.name}: rebuild it with segood report "
                             f"{self.path}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{self.results_json} is unreadable ({err}); rebuild it with segood report") from None


_MISSING = object()  # (a key one description lacks: not the same as its null)


def _differences(path, old, new):
    """'PATH: OLD -> NEW' for each value that differs between two run descriptions, down to their leaves (list
    items of lists of one length too); a long value is shown from a little before where the two first differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [difference for key in {**old, **new}
                for difference in _differences(f"{path}.{key}", old.get(key, _MISSING), new.get(key, _MISSING))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [difference for k, (a, b) in enumerate(zip(old, new))
                for difference in _differences(f"{path}[{k}]", a, b)]
    if old == new and (old is _MISSING) == (new is _MISSING):
        return []
    texts = ["(none)" if v is _MISSING else "{...}" if isinstance(v, dict) else json.dumps(v) for v in (old, new)]
    first = next((k for k, (a, b) in enumerate(zip(*texts)) if a != b), min(map(len, texts)))
    start = max(0, first - 20) if max(map(len, texts)) > 60 else 0
    return [f"{path}: " + " -> ".join(("..." if start else "") + text[start:start + 57] +
                                      ("..." if len(text) > start + 57 else "") for text in texts)]


def grid_of_config(config):
    """The grid of a run's config (runs before the float-order grid name num_thresholds: the linear grid)."""
    from segood.metrics import grid_spec

    return config.get("grid") or grid_spec(config.get("num_thresholds", 400), config.get("score_range", (0.0, 1.0)))
