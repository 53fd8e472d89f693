"""The attack (issue #21): the search space renders inside the pasted region only, the weakest inlier against a
literal loop, the search lowers the target's score on a tiny network, every found sample satisfies the
constraints, sets are reproducible per seed, a killed run resumes to the same sets, and the command line; the
learned fill: crops against a literal point-in-polygon test, the encoder's input centred on 0.5, each crop
trained as it is and mirrored left to right, the batch order from the seed alone, training deterministic per seed
and lowering the loss, the generator file's round trip and refusals, the fill inside the region only, the search
with it."""

import dataclasses
import json
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from segood.attack import DIMENSIONS, Scene, SearchConfig, SearchSpace, calibrate, check_content, ood_only
from segood.attack.constraints import passes_filter, weakest_inlier
from segood.attack.generator import (Autoencoder, load_generator, object_crops, reconstruction_loss, save_generator,
                                     train)
from segood.attack.run import attack, parse_targets
from segood.attack.report import summary_rows
from segood.attack.search import Target, search_frame, search_set
from segood.attack.sets import write_set
from segood.attack.space import reflect
from segood.cli import main
from segood.data import Cityscapes, convert, read_manifest
from segood.data.h5 import H5SegmentationDataset
from segood.data.paste import demo_objects, polygon_mask
from segood.data.sun import SunLabelMap
from segood.data.synthetic import write_cityscapes_tree
from segood.labels import ID, IGNORE, OOD
from segood.methods import get_method
from segood.models import build_model, save_checkpoint
from segood.models.network import preprocess

SIZE = (64, 128)
FRAMES = 3
BUDGET = 12
TARGETS = ("max_logit", "entropy")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Clean frames, a tiny network (random PSPNet, seeded) saved as a checkpoint, the label map and the space."""
    root = tmp_path_factory.mktemp("attack")
    write_cityscapes_tree(root / "cs", 0, (("val", FRAMES),), SIZE)
    convert(Cityscapes(root / "cs", "val"), root / "val.h5", size=SIZE, progress=False)
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18").eval()
    save_checkpoint(root / "tiny.pt", model)
    labels = SunLabelMap("sun")
    bank, _, _ = demo_objects(labels)
    space = SearchSpace(ood_only(bank, labels), lambda o: o.image)
    dataset = H5SegmentationDataset(root / "val.h5")
    scenes = [Scene.from_item(dataset[i]) for i in range(len(dataset))]
    return {"root": root, "model": model, "labels": labels, "bank": bank, "space": space, "scenes": scenes}


@pytest.fixture(scope="module")
def run(world):
    """One attack of both targets, seed 0."""
    out = world["root"] / "run"
    doc = attack([f"{m}={world['root'] / 'tiny.pt'}" for m in TARGETS], world["root"] / "val.h5", out,
                 config=SearchConfig(budget=BUDGET), progress=False, figures=True)
    return out, doc


def test_reflect_against_a_literal_fold():
    def slow(value):  # bounce between the walls, one wall at a time
        while not 0.0 <= value <= 1.0:
            value = -value if value < 0 else 2.0 - value
        return value

    for value in (-2.7, -1.0, -0.3, 0.0, 0.4, 1.0, 1.25, 2.0, 3.6, 5.01):
        assert reflect(value) == pytest.approx(slow(value), abs=1e-12)


def test_sampler_and_proposal_stay_in_the_cube_and_move_one_dimension(world):
    space, rng = world["space"], np.random.default_rng(0)
    assert space.dims == len(DIMENSIONS)
    for _ in range(200):
        u = space.sample(rng)
        v = space.propose(u, rng, 0.3)
        assert ((u >= 0) & (u <= 1)).all() and ((v >= 0) & (v <= 1)).all()
        assert (u != v).sum() <= 1
    with pytest.raises(ValueError, match="numbers in \\[0, 1\\]"):
        space.decode(np.full(space.dims, 1.5))


@pytest.mark.parametrize("texture", [0.1, 0.3, 0.6, 0.9])  # object, perlin, normal, flat
def test_render_changes_the_region_only_and_labels_it_ood(world, texture):
    space, scene = world["space"], world["scenes"][0]
    rng = np.random.default_rng(1)
    rendered = 0
    for _ in range(40):
        u = space.sample(rng)
        u[DIMENSIONS.index("texture")] = texture
        candidate = space.render(scene, u)
        if candidate is None:
            continue
        rendered += 1
        region = candidate.region
        assert region.any() and candidate.params["pixels"] == region.sum()
        assert (candidate.ood_mask[region] == OOD).all() and (candidate.semantic[region] == IGNORE).all()
        assert (candidate.ood_mask[~region] == scene.ood_mask[~region]).all()
        assert (candidate.image[~region] == scene.image[~region]).all()  # blending stays inside the polygon
        again = space.render(scene, u)
        assert (again.image == candidate.image).all()  # deterministic
    assert rendered >= 5


def test_a_point_decodes_by_hand(world):
    space = world["space"]
    n = len(space.objects)
    u = np.array([(2 + 0.5) / n, 0.3, 0.99, 0.5, 0.4, 0.2, 0.4, 0.6, 0.7, 0.25, 0.1, 0.8, 0.5])
    params = space.decode(u)
    assert params["object"] == space.objects[2].key and params["name"] == space.objects[2].name
    assert params["texture"] == "perlin" and params["pattern"] == 15  # int(0.3 * 4) = 1, int(0.99 * 16) = 15
    assert params["frequency"] == pytest.approx(8 ** 0.5)  # 1 to 8 cells on a log scale
    assert params["roughness"] == pytest.approx(0.5) and params["contrast"] == 0.7
    assert params["colour"] == pytest.approx([51.0, 102.0, 153.0])  # red, green, blue
    assert params["brightness"] == pytest.approx(0.75) and params["height_ratio"] == pytest.approx(0.375)
    assert (params["x"], params["y"]) == (0.1, 0.8) and params["u"] == u.tolist()
    ends = space.decode(np.r_[[1.0, 1.0, 1.0, 0.0], np.zeros(9)])  # a coordinate of 1 picks the last choice
    assert ends["object"] == space.objects[-1].key and ends["texture"] == "flat" and ends["pattern"] == 15
    assert ends["frequency"] == 1.0 and ends["height_ratio"] == 0.15 and ends["brightness"] == 0.5


def test_a_point_stands_where_its_coordinates_say(world):
    """The base at x across the frame and y between the row below the horizon and the bottom; the object's lowest
    point on it, horizontally centred, its height the ratio of the base's distance below the horizon."""
    space, rng = world["space"], np.random.default_rng(4)
    objects = {o.key: o for o in space.objects}
    rendered = 0
    for scene in world["scenes"]:
        height, width = scene.ground.shape
        for _ in range(30):
            candidate = space.render(scene, space.sample(rng))
            if candidate is None:
                continue
            rendered += 1
            p = candidate.params
            top = scene.horizon + 1
            base_x, base_y = p["x"] * (width - 1), top + p["y"] * (height - 1 - top)
            assert p["base"] == pytest.approx([base_x, base_y])
            polygon = np.asarray(objects[p["object"]].polygon)
            placed = polygon * p["scale"]
            placed += (base_x - placed[:, 0].min() / 2 - placed[:, 0].max() / 2, base_y - placed[:, 1].max())
            assert np.ptp(placed[:, 1]) == pytest.approx(p["height_ratio"] * (base_y - scene.horizon))
            (x0, y0), mask = polygon_mask(placed, height, width)
            region = np.zeros((height, width), bool)
            region[y0:y0 + mask.shape[0], x0:x0 + mask.shape[1]] = mask
            assert (candidate.region == region).all()
    assert rendered >= 10


def test_proposals_move_every_dimension(world):
    space, rng = world["space"], np.random.default_rng(3)
    moved = np.zeros(space.dims, int)
    u = space.sample(rng)
    for _ in range(400):
        v = space.propose(u, rng, 0.3)
        moved += v != u
        u = v
    assert (moved > 10).all() and moved.sum() == 400  # each of the 13, one a proposal (~31 each)


def test_weakest_inlier_against_a_literal_loop(world):
    model, first = world["model"], world["scenes"][0]
    void = first.ood_mask.copy()
    void[:, :20] = IGNORE  # void pixels are neither ID nor OOD: no part of the inliers
    scenes = [*world["scenes"], dataclasses.replace(first, frame_id="void", ood_mask=void)]
    measured = calibrate(model, [get_method("max_logit")], scenes)
    per_frame, max_logits = [], []
    for scene in scenes:  # softmax by hand in float64, mean over the ID pixels, one frame at a time
        x = preprocess(torch.from_numpy(scene.image).permute(2, 0, 1)[None])
        with torch.no_grad():
            logits = model(x).logits[0].double().numpy()
        e = np.exp(logits - logits.max(axis=0))
        top = (e / e.sum(axis=0)).max(axis=0)
        per_frame.append(top[scene.ood_mask == ID].mean())
        max_logits.append(logits.max(axis=0)[scene.ood_mask == ID])
    assert measured["frame_confidence"] == pytest.approx(per_frame, abs=1e-5)
    # the energy's unit: the standard deviation of the method's scores over the ID pixels of all clean frames
    assert measured["score_std"]["max_logit"] == pytest.approx(np.concatenate(max_logits).std(), rel=1e-4)
    assert measured["weakest_inlier"] == pytest.approx(min(per_frame), abs=1e-5)
    assert weakest_inlier([0.9, None, 0.7, 0.8]) == 0.7
    with pytest.raises(ValueError, match="undefined"):
        weakest_inlier([None])
    assert passes_filter(0.69, 0.7) and not passes_filter(0.7, 0.7)


def test_only_objects_the_label_map_calls_ood(world):
    kept = ood_only(world["bank"], world["labels"])
    assert kept and len(kept) < len(world["bank"])  # the demo bank's cars and persons are left out
    assert all(world["labels"].values(o.name)[0] == OOD for o in kept)
    with pytest.raises(ValueError, match="not OOD under the label map"):
        check_content("car", world["labels"])


def test_the_search_lowers_the_target_score(world):
    model, space, scenes = world["model"], world["space"], world["scenes"]
    method = get_method("max_logit")
    cal = calibrate(model, [method], scenes)
    target = Target(model, method, threshold=cal["weakest_inlier"], scale=cal["score_std"]["max_logit"])
    records = [search_frame(target, space, scene, SearchConfig(budget=25)) for scene in scenes]
    assert all(r["found"] and r["passes"] <= 25 for r in records)
    assert all(r["score"] <= r["start"]["score"] for r in records)
    assert sum(r["score"] < r["start"]["score"] for r in records) >= 2  # a search that moves finds lower scores
    assert np.mean([r["score"] for r in records]) < np.mean([r["start"]["score"] for r in records])


# The chain on a space of two dimensions whose points render without a network: energies and confidences are
# functions of the point, so every acceptance, the kept state and the seeds can be checked by hand.


class PlaneSpace:
    """Points (a, b) of the unit square; a point renders (a stand-in candidate) unless ``feasible`` says no; every
    move changes the image. ``start``: a fixed first sample (the sampler's generator is not drawn from)."""

    dims = 2
    propose = SearchSpace.propose

    def __init__(self, feasible=lambda u: True, start=None):
        self.feasible, self.start = feasible, start

    def sample(self, rng):
        return rng.random(2) if self.start is None else np.array(self.start, np.float64)

    def render_key(self, u):
        return json.dumps([float(v) for v in u])

    def render(self, scene, u):
        return SimpleNamespace(u=np.array(u)) if self.feasible(u) else None


class PlaneTarget:
    """A method named ``name`` whose mean region score is ``energy(u)`` and the region's confidence
    ``confidence(u)``; it records every pass (the point and its dropout seed)."""

    def __init__(self, name="m", *, energy=lambda u: u[0] + u[1], confidence=lambda u: 0.0, threshold=1.0,
                 scale=1.0):
        self.method, self.energy, self.confidence = SimpleNamespace(name=name), energy, confidence
        self.threshold, self.scale, self.passes = threshold, scale, []

    def evaluate(self, candidate, mc_seed=None):
        self.passes.append((candidate.u.tolist(), mc_seed))
        return self.energy(candidate.u), self.confidence(candidate.u)


PLANE_SCENE = SimpleNamespace(frame_id="city/frame_0")


def chain_states(target):
    """The chain's states replayed from the target's passes where only downhill (or level) moves are accepted:
    (energies of the states, how many proposals were accepted)."""
    energies = [target.energy(np.array(target.passes[0][0]))]
    for u, _ in target.passes[1:]:
        e = target.energy(np.array(u))
        if e <= energies[-1]:
            energies.append(e)
    return energies, len(energies) - 1


def test_the_worst_case_is_the_lowest_energy_state_not_the_last():
    # at a very high temperature every move is accepted: the states are all the passes, the chain wanders up and
    # down, and the frame's worst case is the lowest of them (the method's score is lowest there: least OOD)
    target = PlaneTarget()
    record = search_frame(target, PlaneSpace(), PLANE_SCENE, SearchConfig(budget=30, temperature=1e9, step=0.3))
    scores = [target.energy(np.array(u)) for u, _ in target.passes]
    assert record["passes"] == len(target.passes) == 30 and record["accepted"] == record["proposals"] == 29
    assert record["score"] == min(scores) < scores[-1] and record["u"] == target.passes[int(np.argmin(scores))][0]
    assert record["start"]["u"] == target.passes[0][0] and record["start"]["score"] == scores[0]


def test_at_a_low_temperature_the_chain_never_climbs():
    target = PlaneTarget()
    record = search_frame(target, PlaneSpace(), PLANE_SCENE, SearchConfig(budget=30, temperature=1e-9, step=0.3))
    energies, accepted = chain_states(target)
    assert record["accepted"] == accepted < record["proposals"] == 29  # uphill moves were proposed, none taken
    assert record["score"] == energies[-1] == min(target.energy(np.array(u)) for u, _ in target.passes)
    assert record["score"] < record["start"]["score"]


def test_the_energy_is_the_score_in_units_of_its_inlier_spread():
    # a method whose scores are 40 times larger, with a spread 40 times larger, walks the same chain
    config = SearchConfig(budget=40, temperature=0.3, step=0.3)
    unit = PlaneTarget()
    scaled = PlaneTarget(energy=lambda u: 40.0 * (u[0] + u[1]), scale=40.0)
    first, second = (search_frame(t, PlaneSpace(), PLANE_SCENE, config) for t in (unit, scaled))
    assert [u for u, _ in scaled.passes] == [u for u, _ in unit.passes]
    assert second["accepted"] == first["accepted"] and second["score"] == pytest.approx(40.0 * first["score"])
    _, downhill = chain_states(unit)
    assert first["accepted"] > downhill  # at this temperature some uphill moves were taken


def test_the_zero_inlier_filter_keeps_the_chain_off_explained_regions():
    # the score is lowest where a > 0.5, but the network explains those regions (confidence at the threshold or
    # above): the chain never stands there, though those passes were spent
    target = PlaneTarget(energy=lambda u: -u[0], confidence=lambda u: float(u[0] >= 0.5), threshold=0.6)
    record = search_frame(target, PlaneSpace(start=[0.3, 0.5]), PLANE_SCENE,
                          SearchConfig(budget=40, temperature=1e9, step=0.3))
    explained = [u for u, _ in target.passes if u[0] >= 0.5]
    assert explained and record["passes"] == len(target.passes) == 40
    assert record["u"][0] < 0.5 and record["confidence"] == 0.0
    assert record["score"] == min(-u[0] for u, _ in target.passes if u[0] < 0.5)


def test_infeasible_placements_cost_no_pass_and_a_start_is_the_first_feasible_draw():
    target = PlaneTarget()
    space = PlaneSpace(feasible=lambda u: u[1] < 0.5)
    record = search_frame(target, space, PLANE_SCENE, SearchConfig(budget=20, step=0.3))
    assert record["passes"] == len(target.passes) == 20 and all(u[1] < 0.5 for u, _ in target.passes)
    assert record["proposals"] > 19  # proposals off the ground were drawn, and cost nothing
    never = search_frame(PlaneTarget(), PlaneSpace(feasible=lambda u: False), PLANE_SCENE, SearchConfig(budget=3))
    assert never["found"] is False and never["passes"] == 0 and "no feasible start" in never["reason"]


def test_chains_draw_from_the_seed_the_frame_and_the_method():
    config = SearchConfig(budget=10, step=0.3)

    def passes(name, space, **changes):
        target = PlaneTarget(name)
        search_frame(target, space, PLANE_SCENE, SearchConfig(**{**config.to_dict(), **changes}))
        return target.passes

    a, b = passes("a", PlaneSpace()), passes("b", PlaneSpace())
    assert a[0][0] == b[0][0]  # the methods of one network start from the same random sample
    assert [u for u, _ in a[1:]] != [u for u, _ in b[1:]]  # and propose from their own generators
    assert passes("a", PlaneSpace()) == a  # the same seed: the same chain
    fixed = PlaneSpace(start=[0.5, 0.5])  # one start for both seeds: the proposals still follow the seed
    assert [u for u, _ in passes("a", fixed, seed=1)[1:]] != [u for u, _ in passes("a", fixed)[1:]]
    assert passes("a", PlaneSpace(), seed=1)[0][0] != a[0][0]
    seeds = [s for _, s in a]  # every pass draws its own dropout masks, per method
    assert len(set(seeds)) == len(seeds) and not set(seeds) & {s for _, s in b}


def test_a_move_that_renders_the_same_image_moves_the_chain_without_a_pass():
    class InertSecond(PlaneSpace):  # the image ignores the second coordinate
        def render_key(self, u):
            return json.dumps(float(u[0]))

    target = PlaneTarget(energy=lambda u: u[0])
    record = search_frame(target, InertSecond(start=[0.5, 0.5]), PLANE_SCENE, SearchConfig(budget=15, step=0.3))
    assert record["reused"] > 0 and record["passes"] == len(target.passes) == 15
    # the chain stood where the free moves took it: later passes carry the second coordinate they moved
    assert len({u[1] for u, _ in target.passes}) > 1


def test_a_resumed_search_reads_finished_frames_back_without_a_pass(tmp_path):
    scenes = [SimpleNamespace(frame_id=f"city/frame_{k}") for k in range(3)]
    config = SearchConfig(budget=5, step=0.3)
    target = PlaneTarget()
    records = search_set(target, PlaneSpace(), scenes, config, tmp_path, identity={"run": 1}, progress=False)
    assert len(target.passes) == 15 and sorted(p.name for p in tmp_path.iterdir()) == [
        "000000.json", "000001.json", "000002.json"]
    (tmp_path / "000002.json").unlink()  # the run was killed before the last frame
    again = PlaneTarget()
    assert search_set(again, PlaneSpace(), scenes, config, tmp_path, identity={"run": 1}, progress=False) == records
    assert len(again.passes) == 5  # the last frame alone was searched
    with pytest.raises(ValueError, match="belongs to another attack"):  # the frames in another order
        search_set(PlaneTarget(), PlaneSpace(), scenes[::-1], config, tmp_path, identity={"run": 1}, progress=False)
    with pytest.raises(ValueError, match="belongs to another attack"):
        search_set(PlaneTarget(), PlaneSpace(), scenes, config, tmp_path, identity={"run": 2}, progress=False)
    for damage, why in (("", r"JSONDecodeError: Expecting value: line 1 column 1 \(char 0\)"),
                        ("[1]", "AttributeError"), ('{"identity": {"run": 1}}', "KeyError: 'record'")):
        (tmp_path / "000001.json").write_text(damage)
        with pytest.raises(ValueError, match=rf"^{tmp_path / '000001.json'} is damaged \({why}.*\); delete it to "
                                             "search that frame again$"):
            search_set(PlaneTarget(), PlaneSpace(), scenes, config, tmp_path, identity={"run": 1}, progress=False)


def test_every_found_sample_satisfies_the_constraints(world, run):
    out, doc = run
    for method in TARGETS:
        check_found_samples(world, out, doc, method)


def check_found_samples(world, out, doc, method):
    """Every frame of ``method``'s worst-case set: an OOD object of the label map, the clean frame outside the
    region, the zero-inlier filter and the score recomputed from the written frame."""
    model, labels = world["model"], world["labels"]
    threshold = doc["networks"]["tiny"]["weakest_inlier"]
    path = out / "sets" / f"worst_{method}.h5"
    manifest = read_manifest(path)
    assert manifest["attack"]["config"] == {"budget": BUDGET, "temperature": 0.1, "step": 0.1, "seed": 0,
                                            "reuse_unchanged": True}
    assert len(manifest["found"]) + len(manifest["skipped"]) == FRAMES
    dataset = H5SegmentationDataset(path)
    clean = {s.frame_id: s for s in world["scenes"]}
    for k, found in enumerate(manifest["found"]):
        item = dataset[k]
        assert found["frame_id"] == item["frame_id"]
        assert labels.values(found["name"])[0] == OOD  # no ID class of the label map
        region = item["ood_mask"].numpy() == OOD
        assert region.sum() == found["pixels"] > 0
        scene = clean[item["frame_id"]]
        assert (item["image"].permute(1, 2, 0).numpy()[~region] == scene.image[~region]).all()
        with torch.no_grad():  # the zero-inlier filter, recomputed from the written frame
            logits = model(preprocess(item["image"][None])).logits
        confidence = float(torch.softmax(logits, 1).amax(1)[0][torch.from_numpy(region)].mean())
        assert confidence < threshold
        assert confidence == pytest.approx(found["confidence"], abs=1e-5)
        score = get_method(method).score(model, preprocess(item["image"][None]))[0][0][torch.from_numpy(region)]
        assert float(score.double().mean()) == pytest.approx(found["score"], rel=1e-5, abs=1e-6)
        assert found["passes"] <= BUDGET


def test_report_transfer_matrix_and_figures(run):
    out, doc = run
    assert set(doc["matrix"]) == set(TARGETS)
    for method in TARGETS:
        assert set(doc["matrix"][method]) == {"worst_max_logit", "worst_entropy", "random_tiny"}
        for cell in doc["matrix"][method].values():
            assert 0.0 <= cell["auroc"] <= 1.0 and 0.0 <= cell["fpr95"] <= 1.0
        assert (out / "figures" / f"worst_{method}.png").stat().st_size > 0
        assert doc["targets"][method]["mean_score_found"] <= doc["targets"][method]["mean_score_start"]
    text = (out / "attack.md").read_text()
    assert "| worst max_logit |" in text and "Transfer matrix" in text
    assert json.loads((out / "attack.json").read_text())["passes"] == doc["passes"] <= FRAMES * BUDGET * 2


def test_the_sets_hold_the_chains_best_and_start_states(run):
    out, _ = run
    records = [json.loads(p.read_text())["record"] for p in sorted((out / "state" / "max_logit").glob("*.json"))]
    found = [r for r in records if r["found"]]
    assert found and any(r["u"] != r["start"]["u"] for r in found)
    worst = read_manifest(out / "sets" / "worst_max_logit.h5")["found"]
    random = read_manifest(out / "sets" / "random_tiny.h5")["found"]
    assert [(f["frame_id"], f["u"], f["score"]) for f in worst] == [(r["frame_id"], r["u"], r["score"]) for r in found]
    assert [(f["frame_id"], f["u"], f["score"]) for f in random] == [
        (r["frame_id"], r["start"]["u"], r["start"]["score"]) for r in found]
    assert all(f["start_score"] == r["start"]["score"] for f, r in zip(worst, found))


def test_writing_a_set_refuses_an_object_the_label_map_calls_id(world, tmp_path):
    bank = world["bank"]
    space, scene, rng = SearchSpace(bank, lambda o: o.image), world["scenes"][0], np.random.default_rng(0)
    car = next(k for k, o in enumerate(bank) if o.name == "car")
    for _ in range(200):
        u = space.sample(rng)
        u[0] = (car + 0.5) / len(bank)
        if space.render(scene, u) is not None:
            break
    point = {"u": u.tolist(), "score": 0.0, "confidence": 0.0}
    record = {"frame_id": scene.frame_id, "found": True, **point, "start": point, "passes": 1}
    with pytest.raises(ValueError, match="'car' is not OOD under the label map"):
        write_set(tmp_path / "worst.h5", space, [scene], [record], world["labels"])
    assert not (tmp_path / "worst.h5").exists()


def test_the_summary_drop_is_random_minus_worst():
    doc = {"targets": {m: {"network": "net", "set": f"worst_{m}", "random_set": "random_net", "frames": 2,
                           "mean_score_start": 1.0, "mean_score_found": 0.5} for m in ("energy", "sml")},
           "matrix": {"energy": {"worst_energy": {"auroc": 0.625, "fpr95": 0.9}, "random_net": {"auroc": 0.875,
                                                                                                 "fpr95": 0.4}},
                      "sml": {"worst_sml": {"auroc": None, "fpr95": None}, "random_net": {"auroc": 0.5, "fpr95": 1.0},
                              "standard": {"auroc": 0.75, "fpr95": 0.5}}}}
    energy, sml = summary_rows(doc)
    assert energy["auroc_drop"] == 0.25 and energy["worst"]["auroc"] == 0.625 and energy["random"]["auroc"] == 0.875
    assert energy["standard"] is None and sml["standard"] == {"auroc": 0.75, "fpr95": 0.5}
    assert sml["auroc_drop"] is None  # an undefined worst-case AUROC: no drop


def test_sets_are_reproducible_per_seed(world, run):
    out, _ = run
    again = world["root"] / "again"
    attack([f"max_logit={world['root'] / 'tiny.pt'}"], world["root"] / "val.h5", again,
           config=SearchConfig(budget=BUDGET), progress=False, figures=False)
    other = world["root"] / "other_seed"
    attack([f"max_logit={world['root'] / 'tiny.pt'}"], world["root"] / "val.h5", other,
           config=SearchConfig(budget=BUDGET, seed=1), progress=False, figures=False)
    sha = {name: read_manifest(folder / "sets" / "worst_max_logit.h5")["sha256"]
           for name, folder in (("first", out), ("again", again), ("other", other))}
    assert sha["first"] == sha["again"]
    assert sha["first"] != sha["other"]


def test_a_killed_run_resumes_to_the_same_sets(world, run):
    out, _ = run
    resumed = world["root"] / "resumed"
    (resumed / "state" / "max_logit").mkdir(parents=True)
    shutil.copy(out / "state" / "max_logit" / "000001.json", resumed / "state" / "max_logit")  # one frame done
    targets = [f"max_logit={world['root'] / 'tiny.pt'}"]
    with pytest.raises(ValueError, match="holds an attack"):
        attack(targets, world["root"] / "val.h5", resumed, config=SearchConfig(budget=BUDGET), progress=False)
    attack(targets, world["root"] / "val.h5", resumed, config=SearchConfig(budget=BUDGET), progress=False,
           figures=False, resume=True)
    assert (read_manifest(resumed / "sets" / "worst_max_logit.h5")["sha256"]
            == read_manifest(out / "sets" / "worst_max_logit.h5")["sha256"])
    with pytest.raises(ValueError, match="belongs to another attack"):  # other settings never mix in
        attack(targets, world["root"] / "val.h5", resumed, config=SearchConfig(budget=BUDGET + 1), progress=False,
               figures=False, resume=True)


def test_targets_and_frames_are_checked(world):
    with pytest.raises(ValueError, match="METHOD=CHECKPOINT"):
        parse_targets(["energy"])
    with pytest.raises(ValueError, match="named once"):
        parse_targets(["energy=a.pt", "energy=b.pt"])
    with pytest.raises(ValueError, match="budget .--budget. must be a positive integer"):
        SearchConfig(budget=0)
    with pytest.raises(ValueError, match="a/net.pt and b/net.pt share the name 'net'"):
        parse_targets(["max_softmax=a/net.pt", "entropy=b/net.pt"])
    assert parse_targets(["max_softmax=a/net.pt", "entropy=a/../a/net.pt"])[1][1].stem == "net"
    bank = ood_only(demo_objects(SunLabelMap("sun"))[0], SunLabelMap("sun"))
    for ratio in ((0.6, -0.1), (float("nan"), float("nan")), (0.6, 0.2), (0.1, float("inf"))):
        with pytest.raises(ValueError, match="0 < LOW <= HIGH"):
            SearchSpace(bank, lambda obj: obj.image, height_ratio=ratio)
    item = H5SegmentationDataset(world["root"] / "val.h5")[0]
    item["ood_mask"][:2] = OOD
    with pytest.raises(ValueError, match="clean ID frames"):
        Scene.from_item(item)


def test_command_line(world, capsys):
    out = world["root"] / "cli"
    code = main(["attack", "--target", f"energy={world['root'] / 'tiny.pt'}", "--frames",
                 str(world["root"] / "val.h5"), "--out", str(out), "--budget", "4", "--max-frames", "2",
                 "--no-figures"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| energy | tiny |" in printed and (out / "sets" / "worst_energy.h5").exists()
    assert printed.endswith("sets/ (worst_<method>.h5, random_<network>.h5) and eval/\n")  # (no figures/)
    assert main(["attack", "--target", f"energy={world['root'] / 'tiny.pt'}", "--frames", str(world["root"] / "val.h5"),
                 "--out", str(world["root"] / "clean_standard"), "--standard", str(world["root"] / "val.h5")]) == 2
    assert re.fullmatch(rf"segood attack: error: the standard set {re.escape(str(world['root'] / 'val.h5'))} has "
                        r"\d+ ID and 0 OOD pixels, so every metric on it is undefined: give a set with both \(e\.g\. "
                        r"segood convert paste\), or drop --standard\n", capsys.readouterr().err)
    assert main(["attack", "--target", "energy", "--frames", str(world["root"] / "val.h5"), "--out",
                 str(world["root"] / "bad")]) == 2
    assert "METHOD=CHECKPOINT" in capsys.readouterr().err


# The learned fill: a small autoencoder over the bank's OOD object crops, its decoder searched over a latent cube.

GENERATOR_EPOCHS = 40


@pytest.fixture(scope="module")
def generator(world):
    """A generator trained on the demo bank's OOD crops (seed 0), saved to a file."""
    images, masks = object_crops(world["space"].objects, lambda o: o.image)
    model, record = train(images, latent=8, epochs=GENERATOR_EPOCHS, seed=0, progress=False)
    path = world["root"] / "generator.pt"
    save_generator(path, model, record)
    return {"model": model, "record": record, "path": path, "images": images, "masks": masks}


def test_object_crops_against_a_literal_point_in_polygon(world, generator):
    from matplotlib.path import Path as PolygonPath

    images, masks = generator["images"], generator["masks"]
    objects = world["space"].objects
    assert images.shape == (len(objects), 3, 32, 32) and images.dtype == np.float32
    assert 0.0 <= images.min() and images.max() <= 1.0
    for obj, image, mask in zip(objects, images, masks):
        points = np.asarray(obj.polygon)
        x0, y0 = np.floor(points.min(axis=0)).clip(0)
        x1, y1 = np.ceil(points.max(axis=0)) + 1
        x1, y1 = min(x1, obj.image.shape[1]), min(y1, obj.image.shape[0])
        # each crop pixel's centre, mapped back to the source's pixel coordinates, tested against the polygon
        cx = x0 + (np.arange(32) + 0.5) * (x1 - x0) / 32 - 0.5
        cy = y0 + (np.arange(32) + 0.5) * (y1 - y0) / 32 - 0.5
        centres = np.stack(np.meshgrid(cx, cy), -1).reshape(-1, 2)
        slow = PolygonPath(points).contains_points(centres).reshape(32, 32)
        assert (slow != mask).mean() <= 0.02  # pixels exactly on an edge may go either way
        outside = image[:, ~mask]  # one colour outside the object: its mean inside
        assert np.allclose(outside, image[:, mask].mean(axis=1, keepdims=True), atol=1e-6)


def test_generator_training_is_deterministic_per_seed_and_lowers_the_loss(generator):
    images, record = generator["images"], generator["record"]
    again, record_again = train(images, latent=8, epochs=GENERATOR_EPOCHS, seed=0, progress=False)
    other, _ = train(images, latent=8, epochs=GENERATOR_EPOCHS, seed=1, progress=False)
    first = generator["model"].state_dict()
    assert all(torch.equal(first[k], v) for k, v in again.state_dict().items())
    assert record_again["loss"] == record["loss"]
    assert not all(torch.equal(first[k], v) for k, v in other.state_dict().items())
    assert len(record["loss"]) == GENERATOR_EPOCHS and record["crops"] == len(images)
    assert record["loss"][-1] < 0.5 * record["loss"][0]
    mean_image = float(((images - images.mean(axis=0)) ** 2).mean())  # what a decoder of the mean image scores
    assert record["final_loss"] < 0.5 * mean_image
    assert record["final_loss"] == pytest.approx(reconstruction_loss(generator["model"], images))
    with pytest.raises(ValueError, match="\\(N, 3, s, s\\)"):
        train(images[:, :2], progress=False)


def hand_made_crops():
    """Three 8 x 8 crops, each pixel its own value in [0, 1]: crop k, channel c at (y, x) holds
    (8 y + x + 64 c + 192 k) / 575; a flip either way moves every value."""
    k, c, y, x = np.meshgrid(np.arange(3), np.arange(3), np.arange(8), np.arange(8), indexing="ij")
    return ((8 * y + x + 64 * c + 192 * k) / 575).astype(np.float32)


def encoder_inputs(monkeypatch, crops, **options):
    """What the encoder receives in each training batch of :func:`train` on ``crops``: a list of (B, 3, s, s)."""
    from segood.attack import generator as learned_fill

    received = []

    class Recording(Autoencoder):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.encoder.register_forward_pre_hook(
                lambda module, args: received.append(args[0].detach().clone()) if module.training else None)

    monkeypatch.setattr(learned_fill, "Autoencoder", Recording)
    model, _ = train(crops, latent=2, progress=False, **options)
    return received, model


def mirrored(crop):
    """``crop`` (3, s, s) flipped left to right, one column at a time."""
    out = np.empty_like(crop)
    for x in range(crop.shape[2]):
        out[:, :, x] = crop[:, :, crop.shape[2] - 1 - x]
    return out


def test_the_encoder_sees_crops_centred_on_half_grey():
    torch.manual_seed(0)
    model = Autoencoder(latent=2, size=8).eval()
    seen = []
    model.encoder.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    crops = torch.tensor([0.0, 0.25, 0.5, 1.0]).repeat_interleave(48).reshape(1, 3, 8, 8)
    model.encode(crops)
    expected = torch.tensor([-1.0, -0.5, 0.0, 1.0]).repeat_interleave(48).reshape(1, 3, 8, 8)
    assert torch.equal(seen[0], expected)  # 2 x - 1: [0, 1] onto [-1, 1]
    seen.clear()
    model(crops)  # the autoencoder's pass centres the same way
    assert torch.equal(seen[0], expected)


def test_each_crop_enters_training_once_as_it_is_and_once_mirrored_left_to_right(monkeypatch):
    crops = hand_made_crops()
    received, _ = encoder_inputs(monkeypatch, crops, epochs=1, batch_size=2, seed=0)
    epoch = torch.cat(received)
    assert epoch.shape == (6, 3, 8, 8)
    expected = [2 * c - 1 for c in crops] + [2 * mirrored(c) - 1 for c in crops]
    upside_down = [2 * c[:, ::-1] - 1 for c in crops]
    for want in expected:  # each exactly once, centred
        assert sum(torch.equal(got, torch.from_numpy(np.ascontiguousarray(want))) for got in epoch) == 1
    for wrong in upside_down:
        assert not any(torch.equal(got, torch.from_numpy(np.ascontiguousarray(wrong))) for got in epoch)


def test_the_batch_order_is_drawn_from_the_seed_alone(monkeypatch):
    crops = hand_made_crops()
    data = torch.from_numpy(np.stack([*crops, *(mirrored(c) for c in crops)]))  # the crops, then their mirrors
    runs = {}
    for seed, global_seed in ((0, 5), (0, 6), (1, 5)):
        torch.manual_seed(global_seed)  # the global generator plays no part
        runs[seed, global_seed] = encoder_inputs(monkeypatch, crops, epochs=3, batch_size=2, seed=seed)
    for seed in (0, 1):  # each epoch a fresh permutation from one generator seeded with ``seed``
        generator = torch.Generator().manual_seed(seed)
        order = torch.cat([torch.randperm(6, generator=generator) for _ in range(3)])
        received, _ = runs[seed, 5]
        assert len(received) == 9
        for b, batch in enumerate(received):
            assert torch.equal(batch, 2 * data[order[2 * b:2 * b + 2]] - 1)
    (a, model_a), (b, model_b), (other, model_other) = runs[0, 5], runs[0, 6], runs[1, 5]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, other))
    assert model_a.digest() == model_b.digest() != model_other.digest()

def test_generator_file_round_trip_and_refusals(world, generator, tmp_path):
    model, path = generator["model"], generator["path"]
    loaded, record = load_generator(path)
    assert loaded.config() == model.config() == {"latent": 8, "size": 32, "widths": [16, 32, 64]}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in loaded.state_dict().items())
    assert record == generator["record"] and loaded.digest() == model.digest()
    z = np.linspace(-1, 1, 8)
    assert (loaded.texture(z) == model.texture(z)).all()
    assert [p.name for p in path.parent.glob(".generator.pt.*")] == []  # the atomic write left no temporary
    pickle = tmp_path / "pickle.pt"
    torch.save({"format": "segood.generator/1", "config": SearchConfig()}, pickle)  # a Python object inside
    with pytest.raises(ValueError, match="pickled Python objects"):
        load_generator(pickle)
    with pytest.raises(ValueError, match="not a segood generator"):
        load_generator(world["root"] / "tiny.pt")  # a network checkpoint
    half = tmp_path / "half.pt"
    half.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="half.pt is not a readable generator: empty, truncated or corrupt"):
        load_generator(half)
    wrong = tmp_path / "wrong.pt"
    state = torch.load(path, weights_only=True)
    torch.save({**state, "config": {**state["config"], "latent": 9}}, wrong)
    with pytest.raises(ValueError, match="do not fit"):
        load_generator(wrong)
    with pytest.raises(FileNotFoundError, match="no generator"):
        load_generator(tmp_path / "missing.pt")


def test_without_a_generator_the_space_is_the_13_dimensional_one(world, generator):
    plain, learned = world["space"], SearchSpace(world["space"].objects, lambda o: o.image,
                                                 generator=generator["model"])
    assert plain.dims == len(DIMENSIONS) == 13 and "generator" not in plain.describe()
    assert plain.describe()["textures"] == ["object", "perlin", "normal", "flat"]
    assert learned.dims == 13 + 8 and learned.dimensions[13:] == tuple(f"z{k}" for k in range(8))
    assert learned.describe()["generator"] == {"latent": 8, "size": 32, "widths": [16, 32, 64],
                                               "sha256": generator["model"].digest()}
    u = np.full(learned.dims, 0.9)
    assert plain.decode(u[:13])["texture"] == "flat" and "latent" not in plain.decode(u[:13])
    assert learned.decode(u)["texture"] == "learned" and learned.decode(u)["latent"] == pytest.approx([0.8] * 8)
    rest = ("object", "pattern", "colour", "contrast", "brightness", "x", "y", "height_ratio")
    assert {k: plain.decode(u[:13])[k] for k in rest} == {k: learned.decode(u)[k] for k in rest}


def test_learned_fill_renders_inside_the_region_only_and_is_deterministic(world, generator):
    space = SearchSpace(world["space"].objects, lambda o: o.image, generator=generator["model"])
    scene, rng = world["scenes"][0], np.random.default_rng(2)
    rendered = 0
    for _ in range(40):
        u = space.sample(rng)
        u[DIMENSIONS.index("texture")] = 0.95  # learned
        u[DIMENSIONS.index("contrast")] = 1.0
        candidate = space.render(scene, u)
        if candidate is None:
            continue
        rendered += 1
        region = candidate.region
        assert candidate.params["texture"] == "learned"
        assert (candidate.image[~region] == scene.image[~region]).all()
        assert (candidate.ood_mask[region] == OOD).all() and (candidate.semantic[region] == IGNORE).all()
        assert (space.render(scene, u).image == candidate.image).all()  # deterministic for a latent
        v = u.copy()
        v[13:] = 1.0 - u[13:]  # another latent, the same placement: other pixels, in the region only
        moved = space.render(scene, v)
        assert (moved.region == region).all() and (moved.image[~region] == scene.image[~region]).all()
        assert (moved.image[region] != candidate.image[region]).any()
    assert rendered >= 5
    obj = space.objects[0]  # the fill's texture is the decoder's image stretched over the polygon's box
    params = space.decode(np.full(space.dims, 0.95))
    canvas = space.learned_texture(params["latent"], obj.polygon, *obj.image.shape[:2])
    assert canvas.shape == obj.image.shape and 0 <= canvas.min() and canvas.max() <= 255
    texture = 255.0 * generator["model"].texture(params["latent"])
    x0, y0 = np.floor(np.asarray(obj.polygon).min(axis=0)).astype(int).clip(0)
    assert canvas[y0, x0] == pytest.approx(texture[0, 0], abs=255 * 0.05)  # corner pixels agree (bilinear)


class LearnedOnly(SearchSpace):
    """The space with every point filled by the decoder: the search moves the latent, colour and placement."""

    def decode(self, u):
        return {**super().decode(u), "texture": "learned"}


def max_logit_target(world):
    method = get_method("max_logit")
    cal = calibrate(world["model"], [method], world["scenes"])
    return Target(world["model"], method, threshold=cal["weakest_inlier"], scale=cal["score_std"]["max_logit"])


def test_the_search_with_the_learned_fill_lowers_the_target_score(world, generator):
    scenes = world["scenes"]
    space = LearnedOnly(world["space"].objects, lambda o: o.image, generator=generator["model"])
    target = max_logit_target(world)
    records = [search_frame(target, space, scene, SearchConfig(budget=25)) for scene in scenes]
    assert all(r["found"] and r["passes"] <= 25 and len(r["u"]) == 21 for r in records)
    assert all(r["score"] <= r["start"]["score"] for r in records)
    assert sum(r["score"] < r["start"]["score"] for r in records) >= 2
    assert any(np.asarray(r["u"])[13:].tolist() != np.asarray(r["start"]["u"])[13:].tolist() for r in records)


def test_attack_with_a_generator_satisfies_the_constraints_and_resumes_only_with_it(world, generator):
    out = world["root"] / "learned"
    tiny = f"max_logit={world['root'] / 'tiny.pt'}"
    doc = attack([tiny], world["root"] / "val.h5", out, config=SearchConfig(budget=BUDGET), progress=False,
                 figures=False, generator=generator["path"])
    assert doc["space"]["generator"]["sha256"] == generator["model"].digest()
    check_found_samples(world, out, doc, "max_logit")
    manifest = read_manifest(out / "sets" / "worst_max_logit.h5")
    assert all(len(f["latent"]) == 8 and len(f["u"]) == 21 for f in manifest["found"])
    with pytest.raises(ValueError, match="belongs to another attack"):  # the same folder without the generator
        attack([tiny], world["root"] / "val.h5", out, config=SearchConfig(budget=BUDGET), progress=False,
               figures=False, resume=True)


def test_generator_command_line(world, capsys):
    path = world["root"] / "cli_generator.pt"
    assert main(["attack-generator", "--out", str(path), "--latent", "4", "--epochs", "3"]) == 0
    assert "reconstruction loss" in capsys.readouterr().out and load_generator(path)[0].latent == 4
    assert main(["attack-generator", "--out", str(path), "--latent", "3", "--epochs", "1", "--quiet"]) == 0
    assert load_generator(path)[0].latent == 3  # a generator replaces a generator
    checkpoint = world["root"] / "tiny.pt"
    before = checkpoint.read_bytes()
    assert main(["attack-generator", "--out", str(checkpoint), "--epochs", "1", "--quiet"]) == 2
    assert capsys.readouterr().err == (f"segood attack-generator: error: {checkpoint} exists and is not a segood "
                                       "generator (a network's checkpoint?); a generator replaces only a generator: "
                                       "choose another --out\n")
    assert checkpoint.read_bytes() == before
    assert main(["attack-generator", "--out", str(path), "--latent", "4", "--epochs", "3", "--quiet"]) == 0
    out = world["root"] / "cli_learned"
    assert main(["attack", "--target", f"energy={world['root'] / 'tiny.pt'}", "--frames",
                 str(world["root"] / "val.h5"), "--out", str(out), "--budget", "4", "--max-frames", "2", "--quiet",
                 "--no-figures", "--generator", str(path)]) == 0
    assert json.loads((out / "attack.json").read_text())["space"]["dimensions"][-4:] == ["z0", "z1", "z2", "z3"]
    capsys.readouterr()
    assert main(["attack", "--target", f"energy={world['root'] / 'tiny.pt'}", "--frames",
                 str(world["root"] / "val.h5"), "--out", str(world["root"] / "bad_gen"), "--generator",
                 str(world["root"] / "tiny.pt")]) == 2
    assert "not a segood generator" in capsys.readouterr().err


def test_points_of_one_render_key_render_the_same_image(world, generator):
    """The render key against the renders themselves: moves of one dimension that keep the key keep every pixel,
    and moves that change it change the image (unless a placement fails), for every fill, the learned one too."""
    space = SearchSpace(world["space"].objects, lambda o: o.image, generator=generator["model"])
    scene, rng = world["scenes"][0], np.random.default_rng(5)
    same = changed = 0
    for trial in range(150):
        u = space.sample(rng)
        u[DIMENSIONS.index("texture")] = (trial % 5 + 0.5) / 5  # object, perlin, normal, flat, learned in turn
        u[DIMENSIONS.index("contrast")] = max(u[DIMENSIONS.index("contrast")], 0.2)
        v = space.propose(u, rng, 0.3)
        first, second = space.render(scene, u), space.render(scene, v)
        if first is None or second is None:
            continue
        if space.render_key(u) == space.render_key(v):
            same += 1
            assert (first.image == second.image).all()
        elif (first.image != second.image).any():
            changed += 1
    assert same >= 20 and changed >= 20


def test_the_search_spends_no_pass_on_an_unchanged_image(world, generator):
    scenes = world["scenes"]
    space = SearchSpace(world["space"].objects, lambda o: o.image, generator=generator["model"])
    target = max_logit_target(world)
    reusing = search_frame(target, space, scenes[0], SearchConfig(budget=15))
    plain = search_frame(target, space, scenes[0], SearchConfig(budget=15, reuse_unchanged=False))
    assert reusing["found"] and reusing["passes"] <= 15 and reusing["reused"] > 0
    assert reusing["proposals"] > plain["proposals"] and plain["reused"] == 0
    assert reusing["start"] == plain["start"]  # the same chain start: only the accounting of proposals differs
