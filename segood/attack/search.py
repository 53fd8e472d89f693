"""The search: Metropolis MCMC with a temperature over the search space, lowering a method's OOD score over the
pasted region, within a budget of network passes per frame.

The energy of a point is the target method's mean score over its pasted pixels, divided by the spread (standard
deviation) of the method's scores over the ID pixels of the clean frames, so that one temperature means the same
for bounded and unbounded scores (the adversarial-distributions paper standardises on inliers and uses T = 0.1).
A chain starts at the first draw of the uniform sampler that is feasible (placed on the ground, passing the
zero-inlier filter); a proposal moves one dimension (:meth:`SearchSpace.propose`); an infeasible proposal is
rejected (infinite energy, the paper's barrier), a feasible one accepted with probability
min(1, exp(-(E' - E) / T)). The frame's worst case is the chain's lowest-energy state: every state it visits
is feasible, so the found sample satisfies the constraints by construction.

Budget: every rendered candidate costs one network pass (``score_batch`` on one image); a placement that breaks
the ground rules costs none, and proposals stop at ``MAX_DRAWS_PER_PASS`` times the budget (counted apart for
proposals that render the state's image again, which cost nothing). Each chain draws
from generators seeded with (seed, frame id, method) (:func:`segood.data.paste.frame_rng`): the start from
(seed, frame id) alone, so that the methods of one network start from the same random sample, the proposals
and the dropout masks also from the method. A finished frame's state is written atomically to its own file; a
killed run continues with the unfinished frames and ends with the same result.
"""

import json
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

from segood.attack.constraints import confidence_map, passes_filter, region_confidence, weakest_inlier
from segood.data.paste import frame_rng
from segood.io import as_read_back, make_folder, write_json
from segood.labels import ID
from segood.methods.schedule import score_batch
from segood.models.network import device_of, preprocess

MAX_DRAWS_PER_PASS = 10


@dataclass(frozen=True)
class SearchConfig:
    """budget: network passes per frame and method; temperature: of the standardised energy; step: the proposal's
    standard deviation in the unit cube; seed: with the frame id and the method, seeds each chain;
    reuse_unchanged: a proposal that renders the same image as the state (it moved a dimension the state's fill
    never reads, :meth:`SearchSpace.render_key`) keeps the state's energy and is accepted without a pass or a
    draw (such proposals have a bound of their own). For a Monte-Carlo dropout target the kept energy is that of
    the state's dropout draw, where a pass would have drawn the masks anew."""

    budget: int = 100
    temperature: float = 0.1
    step: float = 0.1
    seed: int = 0
    reuse_unchanged: bool = True

    def __post_init__(self):
        if type(self.budget) is not int or self.budget < 1:
            raise ValueError(f"budget (--budget) must be a positive integer, the network passes per frame and "
                             f"method, got {self.budget!r}")
        if not (isinstance(self.temperature, (int, float)) and 0 < self.temperature < math.inf):
            raise ValueError(f"temperature (--temperature) must be a positive finite number, got {self.temperature!r}")
        if not (isinstance(self.step, (int, float)) and 0 < self.step <= 1):
            raise ValueError(f"step (--step) must be a number with 0 < step <= 1 (a standard deviation in the unit "
                             f"cube), got {self.step!r}")
        if type(self.seed) is not int or self.seed < 0:
            raise ValueError(f"seed (--seed) must be a non-negative integer, got {self.seed!r}")
        if type(self.reuse_unchanged) is not bool:
            raise TypeError(f"reuse_unchanged must be True or False, got {self.reuse_unchanged!r}")

    def to_dict(self):
        return asdict(self)


def _image_tensor(image, device):
    return preprocess(torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].to(device))


def _mc_seed(seed, frame_id, stream):
    return int(frame_rng(seed, f"mc/{stream}/{frame_id}").integers(2**31))


def calibrate(model, methods, scenes, *, seed=0):
    """One pass over the clean frames: the network's per-frame ID confidence (mean max-softmax over ID pixels),
    its weakest inlier, and each method's score spread over the ID pixels (the energy's unit).

    Returns {"frame_confidence": [...], "weakest_inlier": float, "score_std": {method name: float}}.
    """
    device = device_of(model)
    sums = {m.name: np.zeros(3) for m in methods}  # count, sum, sum of squares (float64)
    confidences = []
    for scene in scenes:
        batch = score_batch(model, _image_tensor(scene.image, device), methods,
                            mc_seeds=[_mc_seed(seed, scene.frame_id, "calibrate")])
        ids = torch.from_numpy(scene.ood_mask == ID).to(device)
        confidences.append(float(confidence_map(batch.output.logits)[0][ids].mean()) if ids.any() else None)
        for method, score in zip(methods, batch.scores):
            values = score[0][ids].double()
            sums[method.name] += [values.numel(), float(values.sum()), float((values * values).sum())]
    spread = {}
    for name, (n, s, ss) in sums.items():
        std = math.sqrt(max(ss / n - (s / n) ** 2, 0.0)) if n else 0.0
        spread[name] = std if std > 0 else 1.0  # a constant score: energies in its own units
    return {"frame_confidence": confidences, "weakest_inlier": weakest_inlier(confidences), "score_std": spread}


class Target:
    """One method of one network, scored on candidates: energy (standardised mean score over the pasted region)
    and the region's confidence (the zero-inlier filter's measure), from one network pass."""

    def __init__(self, model, method, *, threshold, scale):
        self.model, self.method, self.threshold, self.scale = model, method, float(threshold), float(scale)
        self.device = device_of(model)

    def evaluate(self, candidate, mc_seed=None):
        """(mean score over the region, its confidence) of a :class:`~segood.attack.space.Candidate`."""
        batch = score_batch(self.model, _image_tensor(candidate.image, self.device), [self.method],
                            mc_seeds=None if mc_seed is None else [mc_seed])
        region = torch.from_numpy(candidate.region).to(self.device)
        return float(batch.scores[0][0][region].double().mean()), region_confidence(batch.output.logits, candidate.region)


def search_frame(target, space, scene, config):
    """Run one chain on one scene. Returns the frame's record: ``found`` (False with a ``reason`` when no feasible
    start was drawn within the budget), ``u`` / ``score`` / ``confidence`` of the lowest-energy state,
    ``start`` (the chain's first state: a random feasible sample), ``passes``, ``proposals``, ``accepted``."""
    name = target.method.name
    start_rng = frame_rng(config.seed, f"start/{scene.frame_id}")
    rng = frame_rng(config.seed, f"chain/{name}/{scene.frame_id}")
    mc_base = _mc_seed(config.seed, scene.frame_id, name)
    passes = draws = proposals = accepted = reused = 0
    limit = MAX_DRAWS_PER_PASS * config.budget

    def visit(u):
        nonlocal passes
        candidate = space.render(scene, u)
        if candidate is None:
            return None
        score, confidence = target.evaluate(candidate, mc_seed=mc_base + passes)
        passes += 1
        return (u, score, confidence) if passes_filter(confidence, target.threshold) else None

    state = None
    while state is None and passes < config.budget and draws < limit:
        draws += 1
        state = visit(space.sample(start_rng))
    if state is None:
        return {"frame_id": scene.frame_id, "found": False, "passes": passes,
                "reason": f"no feasible start in {passes} passes ({draws} draws)"}
    start = best = state
    while passes < config.budget and draws < limit and reused < limit:
        proposals += 1
        u = space.propose(state[0], rng, config.step)
        if config.reuse_unchanged and space.render_key(u) == space.render_key(state[0]):
            state, accepted, reused = (u, *state[1:]), accepted + 1, reused + 1  # the same image: E' = E
            continue
        draws += 1
        proposed = visit(u)
        if proposed is None:
            continue
        rise = (proposed[1] - state[1]) / target.scale
        if rise <= 0 or rng.random() < math.exp(-rise / config.temperature):
            state, accepted = proposed, accepted + 1
            if state[1] < best[1]:
                best = state
    record = lambda s: {"u": [float(v) for v in s[0]], "score": s[1], "confidence": s[2]}  # noqa: E731
    return {"frame_id": scene.frame_id, "found": True, **record(best), "start": record(start), "passes": passes,
            "proposals": proposals, "accepted": accepted, "reused": reused}


def search_set(target, space, scenes, config, state_dir, *, identity, progress=True, desc=None):
    """Search every scene, one chain each; a finished frame's record goes atomically to
    ``state_dir/<index>.json`` with ``identity`` (what the run is), and a frame whose file exists is read back
    instead of searched (ValueError when it belongs to another run). Returns the records in scene order."""
    make_folder(state_dir)
    identity = as_read_back(identity)
    records = []
    bar = tqdm(total=len(scenes) * config.budget, desc=desc or f"attack {target.method.name}", unit="pass",
               disable=not progress)
    with bar:
        for index, scene in enumerate(scenes):
            path = state_dir / f"{index:06d}.json"
            if path.exists():
                try:
                    saved = json.loads(path.read_text())
                    ours = saved.get("identity") == identity and saved["record"]["frame_id"] == scene.frame_id
                except (OSError, ValueError, AttributeError, KeyError, TypeError) as err:  # (JSON errors included)
                    raise ValueError(f"{path} is damaged ({type(err).__name__}: {err}); delete it to search that "
                                     "frame again") from None
                if not ours:
                    raise ValueError(f"{path} belongs to another attack (other networks, methods, frames or "
                                     "settings); choose another --out")
                record = saved["record"]
            else:
                record = search_frame(target, space, scene, config)
                write_json(path, {"identity": identity, "record": record})
            records.append(record)
            bar.update(config.budget)
    return records
