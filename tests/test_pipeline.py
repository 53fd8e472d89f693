"""The evaluation pipeline: reading ahead in worker processes gives the batches, errors and counts of reading in the
main process; updates beside the next batch give the state of updates in turn; the state is written in the
background as it was when saved; mixed precision scores float32 logits."""

import json
import zipfile

import numba
import numpy as np
import pytest
import torch

from segood.evaluation import evaluate, reading, runner
from segood.evaluation.class_sums import class_counts, class_sums
from segood.evaluation.options import EvaluateOptions
from segood.evaluation.reading import UnreadableFrame, batch_reader, default_workers, stacked
from segood.evaluation.runner import Evaluation, _Saver
from segood.io import read_npz, write_npz
from segood.methods import get_method
from segood.methods.schedule import score_frames
from segood.robustness import CorruptedSet

from interpreter import run_under_triton_interpreter
from networks import tiny_network


class Frames(torch.utils.data.Dataset):
    """Frames of two sizes, frame ``bad`` unreadable (an OSError, as a damaged file gives)."""

    def __init__(self, n=7, bad=None):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise OSError(f"frame {i} is damaged")
        g = torch.Generator().manual_seed(i)
        height, width = (8, 12) if i % 3 else (6, 10)
        return {"image": torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=g),
                "ood_mask": torch.randint(0, 2, (height, width), dtype=torch.uint8, generator=g),
                "semantic": torch.randint(0, 19, (height, width), dtype=torch.uint8, generator=g)}


def flat(reads):
    return [(name, [(indices, {k: v.clone() for k, v in batch.items()}) for batch, indices in runs], bad)
            for name, (runs, bad) in reads]


@pytest.mark.parametrize("workers, pin", [(1, False), (2, False), (2, True)])
def test_workers_give_the_batches_of_the_main_process_in_order(workers, pin, monkeypatch):
    monkeypatch.delenv("SEGOOD_DEVICE_BATCHES", raising=False)  # (the default: blocks written again)
    sets = {"a": Frames(7), "b": Frames(5)}
    plan = [("a", [0, 1, 2]), ("a", [3, 4, 5]), ("a", [6]), ("b", [0, 1]), ("b", [2, 3, 4])]
    want = flat(zip([n for n, _ in plan], batch_reader(sets, plan, workers=0)))
    got = flat(zip([n for n, _ in plan], batch_reader(sets, plan, workers=workers, pin=pin)))
    assert [(n, [i for i, _ in runs], bad) for n, runs, bad in got] == \
        [("a", [[0], [1, 2]], []), ("a", [[3], [4, 5]], []), ("a", [[6]], []), ("b", [[0], [1]], []),
         ("b", [[2], [3], [4]], [])]  # split where the frame size changes
    for (_, runs_w, _), (_, runs_0, _) in zip(got, want):
        for (_, batch_w), (_, batch_0) in zip(runs_w, runs_0):
            assert all(torch.equal(batch_w[k], batch_0[k]) for k in batch_0)
    for k, (runs, _) in enumerate(batch_reader(sets, plan, workers=workers, pin=pin)):
        for batch, _ in runs:  # one storage a batch: one handshake with the reader
            assert len({t.untyped_storage().data_ptr() for t in batch.values()}) == 1
            # for a device, the readers' images in the frames' own order: copied, not transposed
            layout = torch.channels_last if pin and k else torch.contiguous_format
            assert batch["image"].is_contiguous(memory_format=layout)


@pytest.mark.parametrize("mode", [None, "pageable", "registered"])
def test_readers_write_their_batches_into_blocks_again_only_once_the_main_process_is_done_with_them(mode,
                                                                                                 monkeypatch):
    import time

    monkeypatch.setattr(reading, "device_batches", lambda: mode)  # (None: blocks for the CPU; else for a device,
    sets = {"a": Frames(40)}  # registered with CUDA where there is one: a batch is kept until the batch after next
    plan = [("a", list(range(k, min(k + 3, 40)))) for k in range(0, 40, 3)]  # is asked for; sizes change within
    want = flat(zip([n for n, _ in plan], batch_reader(sets, plan, workers=0)))  # and across batches)
    pin = mode is not None
    blocks, kept = set(), 1 + pin
    got = []
    for (_, runs_0, _), (runs, _) in zip(want, batch_reader(sets, plan, workers=1, pin=pin)):
        time.sleep(0.02)  # a slow consumer: the readers run ahead meanwhile
        got = [*got, (runs_0, runs)][-kept:]
        for runs_0, runs in got:  # (this batch, and for a device the one before)
            for (_, batch_0), (batch, _) in zip(runs_0, runs):
                assert all(torch.equal(batch[k], batch_0[k]) for k in batch_0)
                blocks.add(batch["image"].untyped_storage().data_ptr())
    assert len(blocks) <= 2 + kept + 1 < len(plan)  # (the reader's blocks: at most two ahead and those in use; the
    # first batch is read by the main process. One reader: it writes the batch after next as soon as it may)


@pytest.mark.parametrize("pin, mode", [(False, None), (True, "registered"), (True, "pinned")])
def test_a_batch_that_finds_no_room_in_shared_memory_is_read_in_the_main_process(pin, mode, monkeypatch):
    """A reader that cannot make a block (/dev/shm full: 64 MiB in a container by default) hands the batch back to
    the main process, which reads it itself: the same batches, and one warning that says how to give more room
    (pinned copies too: the DataLoader would drop a batch it cannot place, and wait for it for ever)."""
    monkeypatch.setattr(reading, "device_batches", lambda: mode)
    make = reading.shared_storage

    def small_only(size):  # (in the readers, forked after this patch: blocks above 1000 bytes find no room)
        if size > 1000:
            raise RuntimeError("unable to allocate shared memory(shm): No space left on device (28)")
        return make(size)

    monkeypatch.setattr(reading, "shared_storage", small_only)
    sets = {"a": Frames(9)}
    plan = [("a", [0]), ("a", [1, 2, 4]), ("a", [3]), ("a", [5, 7, 8]), ("a", [6])]  # 1 frame: < 1000 bytes
    want = flat(zip([n for n, _ in plan], batch_reader(sets, plan, workers=0)))
    with pytest.warns(RuntimeWarning, match=r"no room in shared memory .* read in the main process .*--shm-size"):
        got = flat(zip([n for n, _ in plan], batch_reader(sets, plan, workers=2, pin=pin)))
    assert [(n, [i for i, _ in runs], bad) for n, runs, bad in got] == [(n, [i for i, _ in runs], bad)
                                                                        for n, runs, bad in want]
    for (_, runs_w, _), (_, runs_0, _) in zip(got, want):
        for (_, batch_w), (_, batch_0) in zip(runs_w, runs_0):
            assert all(torch.equal(batch_w[k], batch_0[k]) for k in batch_0)


def test_a_batch_is_stacked_as_torch_stack_stacks_it():
    g = torch.Generator().manual_seed(0)
    items = [{"image": torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=g),
              "score": torch.rand(5, 7, generator=g).to(dtype), "ood_mask": torch.rand(5, 7, generator=g) > 0.5,
              "frame_id": f"f{k}"} for k, dtype in enumerate([torch.float16, torch.float32, torch.float16])]
    (batch, indices), = stacked(items, [4, 5, 6])
    assert indices == [4, 5, 6] and list(batch) == ["image", "score", "ood_mask"]
    for key, value in batch.items():
        expected = torch.stack([item[key] for item in items])  # (float16 with float32: float32)
        assert value.dtype == expected.dtype and torch.equal(value, expected)


def test_the_readers_exit_once_the_last_batch_is_in_with_no_further_next():
    import multiprocessing
    import time

    sets = {"a": Frames(6)}
    plan = [("a", [0, 1]), ("a", [2, 3]), ("a", [4, 5])]
    reads = batch_reader(sets, plan, workers=2)
    next(reads)
    readers = multiprocessing.active_children()
    assert len(readers) == 2
    for _ in plan[1:]:
        next(reads)  # (the generator is kept, never resumed after its last batch: as a run's loop leaves it)
    deadline = time.monotonic() + 20
    while any(p.is_alive() for p in readers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(p.is_alive() for p in readers)


def test_the_readers_are_stopped_before_the_reader_is_let_go(monkeypatch):
    import threading
    import time

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as Loader

    stop = Loader._shutdown_workers

    def slow_stop(self):  # (a stop still under way when the generator is closed)
        time.sleep(0.5)
        stop(self)

    monkeypatch.setattr(Loader, "_shutdown_workers", slow_stop)
    plan = [("a", [0, 1]), ("a", [2, 3]), ("a", [4, 5])]
    reads = batch_reader({"a": Frames(6)}, plan, workers=2)
    for _ in plan:
        next(reads)
    reads.close()  # (as when a run's loop lets go of it: a thread left stopping the readers when the interpreter
    assert not any(t.name == "segood-readers-exit" for t in threading.enumerate())  # exits can hang its exit)


def test_the_readers_stop_when_a_frame_is_unreadable_though_its_traceback_is_kept():
    import multiprocessing

    before = set(multiprocessing.active_children())
    plan = [("a", [0, 1]), ("a", [2, 3]), ("a", [4, 5])]
    with pytest.raises(UnreadableFrame) as failed:  # (frame 4, read by a reader process)
        for _ in batch_reader({"a": Frames(6, bad=4)}, plan, workers=2):
            pass
    assert failed.value.__traceback__ is not None  # (held: it holds the batch reader's frame)
    assert set(multiprocessing.active_children()) <= before  # (no reader left holding the sets open)


def test_a_run_that_fails_stops_its_readers_though_its_traceback_is_kept(noise_sets, tmp_path, monkeypatch):
    import multiprocessing

    sets = {p.stem: p for p in sorted(noise_sets().glob("*.h5"))[:1]}
    update, calls = Evaluation.update_pixels, []

    def failing(self, *args, **kwargs):  # (a run that fails in its second batch, its readers reading ahead)
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("scoring failed")
        return update(self, *args, **kwargs)

    monkeypatch.setattr(Evaluation, "update_pixels", failing)
    before = set(multiprocessing.active_children())
    with pytest.raises(RuntimeError, match="scoring failed") as failed:
        evaluate(tiny_network("plain"), sets, ["max_softmax"], tmp_path / "run", batch_size=1, workers=2,
                 progress=False, figures=False, bootstrap=None)
    assert failed.value.__traceback__ is not None  # (held: it holds the pass's frame)
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unreadable_frame_is_raised_or_passed_over_in_the_main_process(workers):
    sets = {"a": Frames(6, bad=4)}
    plan = [("a", [0, 1]), ("a", [2, 3]), ("a", [4, 5])]
    reads = batch_reader(sets, plan, workers=workers)
    assert [indices for _, indices in next(reads)[0]] == [[0], [1]]
    next(reads)
    with pytest.raises(UnreadableFrame, match="cannot read frame 4 .frame 4 is damaged.") as caught:
        next(reads)
    assert caught.value.index == 4
    reads = list(batch_reader(sets, plan, workers=workers, skip_bad=True))
    assert [indices for _, indices in reads[2][0]] == [[5]] and [tuple(b) for b in reads[2][1]] == [(4, "frame 4 is damaged")]


def test_evaluation_with_workers_gives_the_counts_of_reading_in_the_main_process(noise_sets, tmp_path):
    import multiprocessing

    root = noise_sets()
    sets = {p.stem: p for p in sorted(root.glob("*.h5"))[:2]}
    model, states = tiny_network("dropout"), []
    for workers in (0, 2):
        before = set(multiprocessing.active_children())  # (other tests' readers may still be exiting)
        evaluate(model, sets, ["max_softmax", "varsum"], tmp_path / f"w{workers}", batch_size=1, workers=workers,
                 save_every=1, progress=False, figures=False, bootstrap=None)
        assert set(multiprocessing.active_children()) <= before  # (no reader outlives the run, holding sets open)
        states.append(read_npz(tmp_path / f"w{workers}" / "state.npz", "evaluation state"))
    counts = [k for k in states[0] if k.startswith(("pixels/", "class_sums/", "class_counts/", "examples/"))]
    assert counts and set(states[0]) == set(states[1])
    for key in counts:
        np.testing.assert_array_equal(states[0][key], states[1][key], err_msg=key)


def slow_updates(monkeypatch, threads):
    """Each batch's update made slower (so that the next batch is read and scored meanwhile where they overlap),
    the threads they run in noted in ``threads``."""
    import threading
    import time

    update = Evaluation.update_pixels

    def slow(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        time.sleep(0.05)
        return update(self, *args, **kwargs)

    monkeypatch.setattr(Evaluation, "update_pixels", slow)


def test_updates_beside_the_next_batch_give_the_state_of_updates_in_turn(noise_sets, tmp_path, monkeypatch):
    sets = {p.stem: p for p in sorted(noise_sets().glob("*.h5"))[:2]}
    model, states, threads = tiny_network("dropout"), [], []
    slow_updates(monkeypatch, threads)
    for overlap in (False, True):
        monkeypatch.setattr(runner, "_overlaps", lambda device: overlap)
        threads.clear()
        evaluate(model, sets, ["max_softmax", "varsum"], tmp_path / str(overlap), batch_size=2, workers=0,
                 save_every=3, progress=False, figures=False, bootstrap=None)
        states.append(read_npz(tmp_path / str(overlap) / "state.npz", "evaluation state"))
        assert set(threads) == {"segood-update" if overlap else "MainThread"}
    assert set(states[0]) == set(states[1])
    for state in states:  # (the stages' times differ)
        state["progress"] = {k: v for k, v in json.loads(str(state["progress"])).items() if k != "seconds"}
    assert states[0].pop("progress") == states[1].pop("progress")
    for key in states[0]:
        np.testing.assert_array_equal(states[0][key], states[1][key], err_msg=key)


def test_an_unreadable_frame_saves_the_update_of_the_batch_before_where_updates_overlap(noise_sets, tmp_path,
                                                                                        monkeypatch):
    import h5py

    root = noise_sets(kinds=("perlin",), noise_frames=3, cityscapes_frames=3, copy_to=tmp_path / "sets")
    path = root / "perlin_mixed.h5"
    with h5py.File(path, "a") as f:
        f["images"]["4"].id.write_direct_chunk((0, 0, 0), b"not a zlib stream")
    monkeypatch.setattr(runner, "_overlaps", lambda device: True)
    slow_updates(monkeypatch, [])
    with pytest.raises(ValueError, match="cannot read frame 4 .*saved in the run folder"):
        evaluate(tiny_network("plain"), [path], ["max_softmax"], tmp_path / "run", batch_size=2, workers=0,
                 progress=False, figures=False, bootstrap=None)
    saved = Evaluation.load(tmp_path / "run" / "state.npz")
    assert saved.done == {"perlin_mixed": 4} and saved.acc[("max_softmax", "perlin_mixed")].n_images == 4


def test_workers_must_be_a_count():
    assert 0 <= default_workers() <= 16
    assert EvaluateOptions(workers=0).workers == 0
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="workers must be a non-negative integer"):
            EvaluateOptions(workers=bad)


def test_the_background_save_writes_the_state_as_it_was_when_saved(tmp_path):
    ev = Evaluation(["max_logit"], ["s"])
    saver = _Saver(tmp_path / "state.npz")
    saver.save(ev)
    ev.class_count["s"][3] = 7  # changed while the save may still be writing
    saver.wait()
    assert Evaluation.load(tmp_path / "state.npz").class_count["s"][3] == 0
    (tmp_path / "taken").mkdir()
    broken = _Saver(tmp_path / "taken")  # a folder where the file should go
    broken.save(ev)
    with pytest.raises(OSError):
        broken.wait()
    broken.wait()  # raised once


def test_example_frames_are_written_per_set_when_one_is_taken_not_at_every_save(tmp_path):
    from segood.evaluation.runner import examples_path, write_state

    ev, path = Evaluation(["max_logit"], ["s", "t"]), tmp_path / "state.npz"
    saver, frames = _Saver(path), Frames(3)

    def take(set_name, index):
        batch = {k: v[None] for k, v in frames[index].items()}
        scores = torch.rand(batch["ood_mask"].shape, generator=torch.Generator().manual_seed(index))
        ev.process(set_name, [index], batch, {"max_logit": scores})

    def stamp(index):
        info = examples_path(path, index).stat()
        return info.st_ino, info.st_mtime_ns

    take("s", 0)
    assert all(value.base is None for value in ev.examples[("s", 0)].values())  # copies, not views of the batch
    saver.save(ev, wait=True)
    assert not examples_path(path, 1).exists()
    written = stamp(0)
    ev.class_count["s"][3] = 7  # a save with the same examples: their file stays as it was
    saver.save(ev, wait=True)
    assert stamp(0) == written
    assert not any(key.startswith("examples/") for key in read_npz(path, "state"))
    loaded = Evaluation.load(path)
    assert loaded.class_count["s"][3] == 7 and list(loaded.examples) == [("s", 0)]
    np.testing.assert_array_equal(loaded.examples[("s", 0)]["image"], frames[0]["image"].permute(1, 2, 0).numpy())
    take("t", 1)  # the second set's first example: only its file is written
    saver.save(ev, wait=True)
    assert stamp(0) == written
    take("s", 2)  # a new example of the first set: its file is written again
    saver.save(ev, wait=True)
    assert stamp(0) != written
    loaded = Evaluation.load(path)
    assert sorted(loaded.examples) == [("s", 0), ("s", 2), ("t", 1)]
    for key, example in ev.examples.items():
        for field, value in example.items():
            np.testing.assert_array_equal(loaded.examples[key][field], value)

    arrays = ev.arrays()  # a state written before each set had a file: its examples in state.examples.npz
    old = tmp_path / "old" / "state.npz"
    old.parent.mkdir()
    write_npz(old, {k: v for k, v in arrays.items() if not k.startswith("examples/")})
    write_npz(old.with_name("state.examples.npz"), {k: v for k, v in arrays.items() if k.startswith("examples/")})
    assert sorted(Evaluation.load(old).examples) == sorted(ev.examples)
    write_state(old, arrays)
    examples_path(old, 1).unlink()
    with pytest.raises(ValueError, match=r"lists state.examples.1.npz .*missing.*copy the run folder whole"):
        Evaluation.load(old)
    write_npz(old, {**read_npz(old, "state"), "example_files": np.array(["../../etc/passwd"])})
    with pytest.raises(ValueError, match="names '../../etc/passwd' as a file of example frames"):
        Evaluation.load(old)


def test_an_example_frame_keeps_every_step_th_pixel_of_each_map_its_predicted_classes_too():
    ev = Evaluation(["max_logit"], ["s"], examples=(1, 4))  # frames 12 wide, examples at most 4: every 3rd pixel
    frame = Frames(3)[1]
    g = torch.Generator().manual_seed(0)
    logits, scores = torch.randn(1, 19, 8, 12, generator=g), torch.rand(1, 8, 12, generator=g)
    ev.process("s", [0], {k: v[None] for k, v in frame.items()}, {"max_logit": scores}, logits=logits)
    example = ev.examples[("s", 0)]
    expected = {"image": frame["image"].permute(1, 2, 0), "ood_mask": frame["ood_mask"],
                "semantic": frame["semantic"], "classes": logits[0].argmax(dim=0).to(torch.uint8),
                "score_max_logit": scores[0]}
    assert list(example) == list(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(example[key], value[::3, ::3].numpy())


def test_a_kept_tensor_is_the_same_until_another_shape_or_device_is_asked_for():
    from segood.evaluation.runner import KeptTensor

    kept = KeptTensor()
    first = kept.of((2, 3, 4), "cpu")
    assert kept.of(torch.Size([2, 3, 4]), torch.device("cpu")) is first and first.dtype == torch.float32
    assert kept.of((2, 3, 5), "cpu") is not first


def test_the_calibration_of_a_kept_softmax_equals_that_of_torch_softmax_batch_after_batch():
    from segood.methods.functional import max_logit
    from segood.metrics.calibration import CalibrationAccumulator

    ev, expected = Evaluation(["max_logit"], ["s"], quality=True, examples=(0, None)), CalibrationAccumulator()
    frames = Frames(6)
    for indices in ([1, 2], [4, 5], [0]):  # (the last of another size: the kept tensor is made anew)
        batch = {k: torch.stack([frames[i][k] for i in indices]) for k in frames[0]}
        logits = 4 * torch.randn(len(indices), 19, *batch["semantic"].shape[1:],
                                 generator=torch.Generator().manual_seed(indices[0]))
        ev.process("s", indices, batch, {"max_logit": max_logit(logits)}, logits=logits)
        expected.update(torch.softmax(logits, dim=1), batch["semantic"])
    got = ev.calibration["s"]
    assert got.count.sum() == 4 * 8 * 12 + 6 * 10
    for name in ("count", "correct", "confidence"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name))
    assert got.brier == expected.brier


def test_write_npz_deflates_the_members_it_is_told_to(tmp_path):
    arrays = {"counts": np.zeros(1000, np.int64), "ex|image": np.arange(12, dtype=np.uint8).reshape(3, 4)}
    path = tmp_path / "arrays.npz"
    write_npz(path, arrays, compressed=lambda name: not name.startswith("ex|"))
    with zipfile.ZipFile(path) as archive:
        kinds = {info.filename: info.compress_type for info in archive.infolist()}
    assert kinds == {"counts.npy": zipfile.ZIP_DEFLATED, "ex|image.npy": zipfile.ZIP_STORED}
    back = read_npz(path, "test arrays")
    assert all(np.array_equal(back[k], arrays[k]) for k in arrays)
    first = path.read_bytes()
    write_npz(path, arrays, compressed=lambda name: not name.startswith("ex|"))
    assert path.read_bytes() == first  # no time stamps: the same state, the same bytes


def test_mixed_precision_scores_from_float32_logits_near_the_float32_scores():
    model = tiny_network("dropout")
    images = torch.randint(0, 256, (2, 3, 32, 48), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    methods = [get_method(name) for name in ("max_softmax", "entropy", "max_logit", "varsum")]
    full = score_frames(model, images, methods, mc_seeds=[0, 1])
    for amp in ("bf16", "fp16"):
        mixed = score_frames(model, images, methods, mc_seeds=[0, 1], amp=amp)
        assert mixed.output.logits.dtype == torch.float32
        for name, want, got in zip(["max_softmax", "entropy", "max_logit", "varsum"], full.scores, mixed.scores):
            assert got.dtype == want.dtype and not torch.equal(got, want), (amp, name)  # it did run in half
            scale = want.abs().max().item()
            assert (got - want).abs().max().item() <= 0.05 * scale, (amp, name)
    with pytest.raises(ValueError, match="amp must be one of"):
        EvaluateOptions(amp="fp8")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_class_sums_equal_a_float64_bincount_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(2)
    semantic = torch.randint(0, 24, (3, 40, 50), dtype=torch.uint8, generator=g)
    semantic[0, :5] = 255
    semantic[2] = torch.randint(0, 21, (40, 1), dtype=torch.uint8, generator=g)  # rows of one class: runs
    semantic[2, -1] = 4  # (the last run of a class)
    scores = (torch.randn(3, 40, 50, generator=g) * 1e3).to(dtype)
    scores[1, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    index = torch.where(semantic < 19, semantic, 19).long().flatten()
    weights = scores.flatten().to(torch.float64).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    want = torch.bincount(index, weights=weights, minlength=20)[:19]
    got = class_sums(semantic, scores, 19)
    assert got.dtype == torch.float64 and torch.equal(got, want)
    np.testing.assert_array_equal(class_counts(semantic, 19), torch.bincount(index, minlength=20)[:19].numpy())


def test_the_device_class_sums_in_blocks_equal_the_sums_pixel_by_pixel():
    """The device path (partial sums per block of pixels, then the rows summed), run on CPU tensors: counts exact,
    sums equal to the in-order float64 sums up to their rounding (another order of additions)."""
    from segood.metrics._device import SUM_BLOCK as BLOCK, blockwise_sums

    g = torch.Generator().manual_seed(3)
    semantic = torch.randint(0, 24, (2, 3 * BLOCK + 17), dtype=torch.uint8, generator=g)  # a partial last block
    semantic[0, :BLOCK] = 7  # a block of one class
    scores = torch.randn(semantic.shape, generator=g, dtype=torch.float64) * 1e3
    index = torch.where(semantic < 19, semantic, 19).long().flatten()
    ones = torch.ones(1, dtype=torch.int64).expand(semantic.numel())
    assert torch.equal(blockwise_sums(semantic, ones, 19), torch.bincount(index, minlength=20)[:19])
    want = torch.bincount(index, weights=scores.flatten(), minlength=20)[:19]
    torch.testing.assert_close(blockwise_sums(semantic, scores.flatten(), 19), want, rtol=1e-12, atol=1e-9)


def check_kernel_sums():
    """The device's per-class sums by the Triton kernel (run on CPU tensors in Triton's interpreter) against the
    in-order float64 sums: float16, bfloat16, float32 and float64 scores; NaN and ±inf added as 0; pixels of no class
    (19-23, 255) left out; a partial last block; a block of one class. Summed twice: the same bits. And the
    calibration's sums: int64 bins against bincount."""
    from segood.metrics import _sums_triton
    from segood.metrics._device import SUM_BLOCK as BLOCK, label_sums

    g = torch.Generator().manual_seed(4)
    semantic = torch.randint(0, 24, (2, 3 * BLOCK + 17), dtype=torch.uint8, generator=g)
    semantic[0, :BLOCK] = 7
    semantic[1, :50] = 255
    scores = torch.randn(semantic.shape, generator=g, dtype=torch.float64) * 1e3
    scores[0, 3:7] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], dtype=torch.float64)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        s = scores.to(dtype)
        want = class_sums(semantic, s, 19)  # (the CPU's, in order)
        got = label_sums(semantic, s, 19, kernel=_sums_triton)
        assert got.dtype == torch.float64 and torch.equal(got, label_sums(semantic, s, 19, kernel=_sums_triton))
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-9)
        print(f"{dtype}: equal", flush=True)
    bins = torch.randint(0, 15, (5000,), generator=g)  # the calibration's: int64 labels, float64 confidences
    confidence = torch.rand(5000, generator=g, dtype=torch.float64)
    torch.testing.assert_close(label_sums(bins, confidence, 15, kernel=_sums_triton),
                               torch.bincount(bins, weights=confidence, minlength=15), rtol=1e-12, atol=1e-12)
    print("calibration bins: equal", flush=True)


def check_kernel_calibration():
    """The calibration's Triton kernel (run on CPU tensors in Triton's interpreter) against its torch operations:
    counts and hits equal, confidence and Brier sums up to rounding (another order), the same bits twice; float32
    and float16 probabilities, int64 and uint8 targets, ties and a confidence of 1, a partial last block of pixels;
    a bad target and a NaN where no pixel counts found."""
    from segood.metrics import _calibration_triton
    from segood.metrics.calibration import BAD_TARGET, BLOCK, NOT_FINITE, CalibrationAccumulator, _kernel_totals

    g = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(2, 19, 3, BLOCK // 2 + 7, generator=g) * 3, dim=1)  # 2 blocks an image
    probs[0, :, 0, :3] = torch.eye(19)[:3].T  # a confidence of 1
    probs[1, :, 1, :2] = 0.0
    probs[1, 4:6, 1, :2] = 0.5  # a tie: class 4 wins
    target = torch.randint(0, 19, probs[:, 0].shape, generator=g)
    target[torch.rand(target.shape, generator=g) < 0.2] = 255
    target[1, 1, :2] = 4  # (a hit only if the first of the tied classes is predicted)
    for dtype in (torch.float32, torch.float16):
        for classes in (target, target.to(torch.uint8)):
            p = probs.to(dtype)
            want = CalibrationAccumulator()._update_torch(p, classes)
            count, correct, confidence, brier, problem = _kernel_totals(p, classes, 15, _calibration_triton)
            assert problem == 0 and np.array_equal(count, want.count) and np.array_equal(correct, want.correct)
            np.testing.assert_allclose(confidence, want.confidence, rtol=1e-12)
            assert abs(brier - want.brier) <= 1e-12 * want.brier
            again = _kernel_totals(p, classes, 15, _calibration_triton)
            assert np.array_equal(again[2], confidence) and again[3] == brier
            print(f"calibration {dtype} {classes.dtype}: equal", flush=True)
    assert _kernel_totals(probs, torch.where(target == 255, 255, 19), 15, _calibration_triton)[4] == BAD_TARGET
    y, x = (int(v[0]) for v in torch.nonzero(target[1] == 255, as_tuple=True))
    holed = probs.clone()
    holed[1, 7, y, x] = float("nan")
    assert _kernel_totals(holed, target, 15, _calibration_triton)[4] == NOT_FINITE
    print("calibration problems: equal", flush=True)


def test_the_sums_and_calibration_kernels_in_the_interpreter_equal_their_references():
    out = run_under_triton_interpreter(__file__)
    assert out.count("equal") == 10, out


def test_the_weights_digest_is_made_again_only_when_a_weight_changes():
    from segood.evaluation.api import _weights_sha256

    model = tiny_network()
    first = _weights_sha256(model)
    assert _weights_sha256(model) == first
    with torch.no_grad():
        next(model.parameters()).mul_(2.0)  # in place: its version counter moves
    changed = _weights_sha256(model)
    assert changed != first
    with torch.no_grad():
        next(model.parameters()).mul_(0.5)  # exactly back
    assert _weights_sha256(model) == first  # the same bytes, the same digest, recomputed
    model.load_state_dict(tiny_network("plain").state_dict())
    assert _weights_sha256(model) == first


def test_a_small_pass_is_read_in_the_main_process_unless_workers_are_asked_for():
    class Sized(Frames):
        sizes = [(8, 12)] * 7

    plan = [("a", [0, 1, 2]), ("a", [3, 4])]
    assert default_workers({"a": Sized()}, plan) == 0  # 480 pixels: starting a process costs more
    corrupted = CorruptedSet(Sized(), "noise", 1)
    assert default_workers({"a": corrupted}, plan) == 0  # a corrupted set: the sizes of the set it corrupts
    assert default_workers({"a": Frames()}, plan) == default_workers()  # sizes unknown: the readers
    Sized.sizes = [(4096, 4096)] * 7
    assert default_workers({"a": Sized()}, plan) == default_workers()


class ThreadsSeen(torch.nn.Module):
    """Fixed logits; records the torch threads its forward pass ran with."""

    def __init__(self):
        super().__init__()
        self.seen = []
        self.logits = torch.nn.Parameter(torch.randn(1, 19, 8, 12, generator=torch.Generator().manual_seed(0)),
                                         requires_grad=False)

    def forward(self, x):
        self.seen.append(torch.get_num_threads())
        return self.logits.expand(x.shape[0], -1, -1, -1)


def test_beside_readers_the_main_process_leaves_them_their_cores_but_not_the_network():
    from segood._threads import beside_readers, cores
    from segood.models.external import as_network

    full, full_numba = torch.get_num_threads(), numba.get_num_threads()
    model = ThreadsSeen()
    with beside_readers(1):
        assert torch.get_num_threads() == max(1, min(full, cores() - 1))
        assert numba.get_num_threads() == max(1, min(full_numba, cores() - 1))
        score_frames(as_network(model), torch.zeros(2, 3, 8, 12, dtype=torch.uint8), [get_method("max_logit")])
        assert model.seen == [full] and torch.get_num_threads() == max(1, min(full, cores() - 1))
    with beside_readers(0):
        assert (torch.get_num_threads(), numba.get_num_threads()) == (full, full_numba)
    assert (torch.get_num_threads(), numba.get_num_threads()) == (full, full_numba)


def test_a_compiled_forward_pass_gives_the_counts_of_the_network_as_it_is(noise_sets, tmp_path):
    """--compile: the forward pass goes through torch.compile (the "eager" backend here: dynamo captures the graph
    and runs it as it is, so the counts are equal bit for bit; inductor's fused kernels may round otherwise). The
    model itself is left uncompiled, and the backend is recorded with the run."""
    import json

    import torch._dynamo

    from segood.methods.schedule import compiled

    sets = {p.stem: p for p in sorted(noise_sets().glob("*.h5"))[:1]}
    model, states = tiny_network("plain"), []
    torch._dynamo.reset()
    for backend in (None, "eager"):
        evaluate(model, sets, ["max_softmax", "energy"], tmp_path / str(backend), batch_size=2, compile=backend,
                 progress=False, figures=False, bootstrap=None)
        states.append(read_npz(tmp_path / str(backend) / "state.npz", "evaluation state"))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # (the graphs dynamo captured)
    for key in [k for k in states[0] if k.startswith(("pixels/", "class_sums/"))]:
        np.testing.assert_array_equal(states[0][key], states[1][key], err_msg=key)
    assert json.loads((tmp_path / "eager" / "run.json").read_text())["config"]["compile"] == "eager"
    assert "compile" not in json.loads((tmp_path / "None" / "run.json").read_text())["config"]
    assert "forward" not in vars(model)
    with pytest.raises(ValueError, match="unknown torch.compile backend 'inductr'"):
        EvaluateOptions(compile="inductr")
    with pytest.raises(ValueError, match="compile needs a network"):
        compiled(lambda images: images)


def test_the_way_batches_reach_a_device_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("SEGOOD_DEVICE_BATCHES", raising=False)
    assert reading.device_batches() == "registered"
    monkeypatch.setenv("SEGOOD_DEVICE_BATCHES", "pinned")
    assert reading.device_batches() == "pinned"
    monkeypatch.setenv("SEGOOD_DEVICE_BATCHES", "pinnned")
    with pytest.raises(ValueError, match="SEGOOD_DEVICE_BATCHES must be one of registered, pinned, pageable, got "
                                         "'pinnned'"):
        next(batch_reader({"a": Frames(4)}, [("a", [0, 1]), ("a", [2, 3])], workers=1, pin=True))
    with pytest.raises(ValueError, match="SEGOOD_DEVICE_BATCHES"):  # (and by a run's options, before its network
        EvaluateOptions()  # is loaded: the command line makes them first)


if __name__ == "__main__":  # the interpreter test's subprocess: TRITON_INTERPRET=1 is set
    check_kernel_sums()
    check_kernel_calibration()

