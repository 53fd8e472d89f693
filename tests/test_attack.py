"""The attack (issue #21): the search space renders inside the pasted region only, the weakest inlier against a
literal loop, the search lowers the target's score on a tiny network, every found sample satisfies the
constraints, sets are reproducible per seed, a killed run resumes to the same sets, and the command line; the
learned fill: crops against a literal point-in-polygon test, training deterministic per seed and lowering the
loss, the generator file's round trip and refusals, the fill inside the region only, the search with it."""

import json
import shutil

import numpy as np
import pytest
import torch

from segood.attack import DIMENSIONS, Scene, SearchConfig, SearchSpace, calibrate, check_content, ood_only
from segood.attack.constraints import passes_filter, weakest_inlier
from segood.attack.generator import load_generator, object_crops, reconstruction_loss, save_generator, train
from segood.attack.run import attack, parse_targets
from segood.attack.search import Target, search_frame
from segood.attack.space import reflect
from segood.cli import main
from segood.data import Cityscapes, convert, read_manifest
from segood.data.h5 import H5SegmentationDataset
from segood.data.paste import demo_objects
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


def test_weakest_inlier_against_a_literal_loop(world):
    model, scenes = world["model"], world["scenes"]
    measured = calibrate(model, [get_method("max_logit")], scenes)
    per_frame = []
    for scene in scenes:  # softmax by hand in float64, mean over the ID pixels, one frame at a time
        x = preprocess(torch.from_numpy(scene.image).permute(2, 0, 1)[None])
        with torch.no_grad():
            logits = model(x).logits[0].double().numpy()
        e = np.exp(logits - logits.max(axis=0))
        top = (e / e.sum(axis=0)).max(axis=0)
        per_frame.append(top[scene.ood_mask == ID].mean())
    assert measured["frame_confidence"] == pytest.approx(per_frame, abs=1e-5)
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
                 str(world["root"] / "val.h5"), "--out", str(out), "--budget", "4", "--max-frames", "2", "--quiet",
                 "--no-figures"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| energy | tiny |" in printed and (out / "sets" / "worst_energy.h5").exists()
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
    assert main(["attack-generator", "--out", str(path), "--latent", "4", "--epochs", "3", "--quiet"]) == 0
    assert "reconstruction loss" in capsys.readouterr().out and load_generator(path)[0].latent == 4
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
