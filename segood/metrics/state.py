"""The state contract every part of a run keeps (after torchmetrics' ``Metric.add_state(..., dist_reduce_fx=...)``),
and the one merge and the one all-reduce that serve them all.

A part (an accumulator, or the whole run) has ``state_dict()``: {key: plain numpy array} (saved as an ``.npz``,
never a pickle), ``from_state_dict(state)`` or ``load_state_dict(state)`` (every field checked: a file is untrusted
input), and ``reductions``: how each key of two states combines (keys not named there are ``"same"``):

- ``"sum"``, ``"max"``, ``"min"``: element by element (counts, sums; ``"min"`` of flags is "and");
- ``"same"``: settings, equal in both (a merge of different ones is an error);
- ``"local"``: this process's own (progress, timings, example frames): a merge keeps the first state's, an
  all-reduce leaves each rank its own;
- ``"cat"``: rows concatenated along the first axis (per-image rows, the exact grid's scores);
- ``"offsets"``: the offsets of a ``"cat"`` ragged array ([0, ..., n]): the second's shifted by the first's end;
- a tuple of keys (the entry's key) mapped to a function of their values in both states (``f(*a, *b)``), giving
  their merged values: tables of variable size merged jointly, such as the float-order grid's (binades, counts).

:func:`merge_states` combines two states so. :func:`all_reduce_state` combines every rank's state over
``torch.distributed`` (gloo on CPU, NCCL on CUDA): the element-wise keys are all-reduced in place, packed one tensor
per dtype and operation in their own dtype (int64 counts stay int64: exact at any size, where float64 would be
exact below 2^53 only); the others, whose sizes differ between ranks, are all-gathered and folded with
:func:`merge_states` in rank order, so an all-reduce equals merging the ranks' states in rank order. Every rank
must hold the same keys but its ``"local"`` ones. :class:`Part` gives ``merge``, ``all_reduce``, ``copy``,
``save`` and ``load`` from the contract.
"""

import json

import numpy as np

from segood.io import read_state, write_npz

MAX_PIXELS = 1 << 58  # counts beyond this are no real set (and 20 x a count must stay within int64)
ELEMENTWISE = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_WIRE = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")  # dtypes that travel


def check_counts(counts, key):
    """Non-negative integer counts whose total stays below MAX_PIXELS (compared as Python integers)."""
    if counts.size and (int(counts.min()) < 0 or int(counts.max()) > MAX_PIXELS):
        raise ValueError(f"accumulator state {key!r} must hold non-negative counts below 2^58")
    total = exact_total(counts)
    if total > MAX_PIXELS:
        raise ValueError(f"accumulator state {key!r} counts {total} pixels in all, more than 2^58")


def exact_total(counts):
    """The sum of non-negative integer ``counts`` of at most 2^58 each, exactly (a Python int): the high and the
    low 29 bits summed apart in int64, where neither sum can wrap around below 2^34 counts (128 GiB of them; a
    sum of Python ints, one per count, took 0.2 s for 1.4 M counts)."""
    counts = np.asarray(counts).astype(np.int64, copy=False).ravel()
    return (int((counts >> 29).sum()) << 29) + int((counts & ((1 << 29) - 1)).sum())


def merge_states(a, b, reductions):
    """Two states (``state_dict()`` outputs) combined by their ``reductions`` (see the module docstring); a key
    only one of them holds is taken as it is. Settings are compared first, so that nothing is combined across
    different configurations."""
    how = by_key(reductions)
    out = {**b, **a}
    both = [k for k in a if k in b]
    for key in sorted(both, key=lambda k: how.get(k, "same") != "same"):
        rule = how.get(key, "same")
        if isinstance(rule, tuple):
            keys, joint = rule
            if key == keys[0] and all(k in both for k in keys):
                out.update(zip(keys, joint(*(a[k] for k in keys), *(b[k] for k in keys))))
        else:
            out[key] = _reduce(rule, key, np.asarray(a[key]), np.asarray(b[key]))
    return out


def by_key(reductions):
    """{key: reduction name, or (keys, function) for the keys of a joint entry}."""
    return {key: (keys, how) if isinstance(keys, tuple) else how for keys, how in reductions.items()
            for key in (keys if isinstance(keys, tuple) else (keys,))}


def _reduce(how, key, a, b):
    if how in ELEMENTWISE:
        if a.shape != b.shape:
            raise ValueError(f"cannot merge states whose {key!r} differ in shape: {a.shape} vs {b.shape}")
        return ELEMENTWISE[how](a, b).astype(np.result_type(a, b))
    if how == "cat":
        return np.concatenate([a, b])
    if how == "offsets":
        return np.concatenate([a, b[1:] + a[-1]])
    if how == "local":
        return a
    if how == "same":
        if not (a.shape == b.shape and (a == b).all() or a.dtype.kind == "f" and np.array_equal(a, b, equal_nan=True)):
            raise ValueError(f"cannot merge states with different configurations: {key!r} is {a} vs {b}")
        return a
    raise ValueError(f"unknown reduction {how!r} of state key {key!r}")


def distributed():
    """Whether a ``torch.distributed`` process group of more than one rank is up."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_state(state, reductions):
    """Every rank's ``state`` combined by its ``reductions`` (see the module docstring), on every rank; the state
    itself without a process group."""
    if not distributed():
        return state
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    how, state = by_key(reductions), {k: np.asarray(v) for k, v in state.items()}
    out = dict(state)
    for op in ELEMENTWISE:
        keys = [k for k in state if how.get(k) == op]
        for dtype in sorted({state[k].dtype for k in keys}, key=str):  # (in one order on every rank)
            group = [k for k in keys if state[k].dtype == dtype]
            tensor = torch.from_numpy(_packed([state[k] for k in group], dtype)).to(device)
            dist.all_reduce(tensor, getattr(dist.ReduceOp, op.upper()))
            out.update(zip(group, _unpacked(tensor.cpu().numpy(), [state[k].shape for k in group], dtype)))
    gathered = [k for k in state if how.get(k, "same") not in (*ELEMENTWISE, "same", "local")]
    if gathered:
        ranks = _all_gather({k: state[k] for k in gathered}, device)
        for other in ranks[1:]:
            ranks[0] = merge_states(ranks[0], other, reductions)
        out.update(ranks[0])
    return out


def all_gather_json(value):
    """[``value`` of every rank] in rank order (a JSON-able value; [value] without a process group)."""
    if not distributed():
        return [value]
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    return [json.loads(rank["value"].tobytes()) for rank in _all_gather({"value": data}, device)]


def _packed(arrays, dtype, size=0):
    """``arrays`` as one flat array of ``dtype`` (bool as uint8, which every backend carries), zero-padded to
    ``size``."""
    flat = np.concatenate([a.astype(dtype).ravel() for a in arrays]).astype(np.uint8 if dtype == bool else dtype)
    return np.pad(flat, (0, max(0, size - flat.size)))


def _unpacked(flat, shapes, dtype):
    """The arrays of ``shapes`` that :func:`_packed` packed into ``flat``."""
    ends = np.cumsum([int(np.prod(s)) for s in shapes]).astype(int)
    return [part.astype(dtype).reshape(s) for part, s in zip(np.split(flat[: ends[-1]], ends[:-1]), shapes)]


def _all_gather(arrays, device):
    """[{key: array}] of every rank, in rank order (each key's arrays may differ in size and dtype between ranks;
    they come back in the dtype they all fit)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    header = np.concatenate([[_WIRE.index(a.dtype.name), *a.shape] for a in arrays.values()]).astype(np.int64)
    headers = [torch.zeros(header.size, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(headers, torch.from_numpy(header).to(device))
    shapes, dtypes = [{} for _ in range(world)], {}
    for rank, h in enumerate(headers):
        h, start = h.cpu().numpy(), 0
        for key, a in arrays.items():
            shapes[rank][key] = tuple(int(v) for v in h[start + 1 : start + 1 + a.ndim])
            dtypes[key] = np.result_type(dtypes.get(key, _WIRE[h[start]]), _WIRE[h[start]])
            start += 1 + a.ndim
    ranks = [{} for _ in range(world)]
    for dtype in sorted(set(dtypes.values()), key=str):
        keys = [k for k in arrays if dtypes[k] == dtype]
        size = max(1, *(sum(int(np.prod(s[k])) for k in keys) for s in shapes))  # (no empty collectives)
        mine = torch.from_numpy(_packed([arrays[k] for k in keys], dtype, size)).to(device)
        parts = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        for rank, part in enumerate(parts):
            ranks[rank].update(zip(keys, _unpacked(part.cpu().numpy(), [shapes[rank][k] for k in keys], dtype)))
    return ranks


class Part:
    """``merge``, ``all_reduce``, ``copy``, ``save``, ``load`` and ``load_state_dict`` for a class with
    ``state_dict()``, ``from_state_dict(state)`` (or its own ``load_state_dict``) and ``reductions`` (the module
    docstring); ``STATE_NAME`` names its files in errors (default: "<class name> state")."""

    STATE_NAME = None
    reductions = {}

    def merge(self, other):
        """Add another part's state to this one (in place, by the declared reductions); returns self."""
        self._check_mergeable(other)
        return self.load_state_dict(merge_states(self.state_dict(), other.state_dict(), self.reductions))

    def all_reduce(self):
        """Combine the state over all ``torch.distributed`` ranks (in place; a no-op without a process group). Call
        it once, after the last update: every rank then holds the state of all."""
        if distributed():
            self.load_state_dict(all_reduce_state(self.state_dict(), self.reductions))
        return self

    def load_state_dict(self, state):
        """Take ``state`` (checked as :meth:`from_state_dict` checks it), in place; returns self."""
        vars(self).update(vars(type(self).from_state_dict(state)))
        return self

    def _check_mergeable(self, other):
        if not isinstance(other, type(self)):
            raise TypeError(f"can only merge a {type(self).__name__}, got {type(other).__name__}")

    def copy(self):
        return type(self).from_state_dict(self.state_dict())

    def save(self, path):
        """Write the state to an ``.npz`` file, atomically."""
        write_npz(path, self.state_dict())

    @classmethod
    def load(cls, path):
        """Read a state written by :meth:`save` (never unpickles); a ValueError names the file when it is not one."""
        return read_state(cls.from_state_dict, path, cls.STATE_NAME or f"{cls.__name__} state")


def flatten(tree, rules, prefix=""):
    """A tree of parts as one state: (state {path: array}, reductions {path: reduction}). A node is a dict (keyed
    by a name, or a tuple of names: one path level each), a part (its ``state_dict()`` under the node's path, its
    ``reductions`` alike) or an array, reduced by ``rules``: {name: reduction (or such a dict one level down)} or one
    reduction for everything below. Names must not hold '/', the path separator."""
    state, reductions = {}, {}
    for name, node in tree.items():
        rule = rules.get(name, "same") if isinstance(rules, dict) else rules
        path = prefix + "/".join(map(str, name if isinstance(name, tuple) else (name,)))
        if hasattr(node, "state_dict"):
            state.update({f"{path}/{key}": value for key, value in node.state_dict().items()})
            reductions.update({tuple(f"{path}/{k}" for k in key) if isinstance(key, tuple) else f"{path}/{key}": how
                               for key, how in node.reductions.items()})
        elif isinstance(node, dict):
            sub_state, sub_reductions = flatten(node, rule, f"{path}/")
            state.update(sub_state)
            reductions.update(sub_reductions)
        else:
            state[path], reductions[path] = np.asarray(node), rule
    return state, reductions


def unflatten(state):
    """The tree of nested dicts of a flat state {path: array} (the paths split at '/')."""
    tree = {}
    for path, value in state.items():
        *parents, name = path.split("/")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = value
    return tree
