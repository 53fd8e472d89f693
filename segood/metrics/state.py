"""What every state a run saves and loads shares: writing and reading it as a plain ``.npz`` (never a pickle),
and the checks of counts read from a file, which are untrusted input."""

from segood.io import read_state, write_npz

MAX_PIXELS = 1 << 58  # counts beyond this are no real set (and 20 x a count must stay within int64)


def check_counts(counts, key):
    """Non-negative integer counts whose total stays below MAX_PIXELS (compared as Python integers)."""
    if counts.size and (int(counts.min()) < 0 or int(counts.max()) > MAX_PIXELS):
        raise ValueError(f"accumulator state {key!r} must hold non-negative counts below 2^58")
    total = sum(int(v) for v in counts.ravel()) if counts.size else 0  # Python ints: no wraparound
    if total > MAX_PIXELS:
        raise ValueError(f"accumulator state {key!r} counts {total} pixels in all, more than 2^58")


class StateFile:
    """``save`` / ``load`` / ``copy`` for a class with ``state_dict()`` and ``from_state_dict(state)``;
    ``STATE_NAME`` names its files in errors (default: "<class name> state")."""

    STATE_NAME = None

    def copy(self):
        return type(self).from_state_dict(self.state_dict())

    def save(self, path):
        """Write the state to an ``.npz`` file, atomically."""
        write_npz(path, self.state_dict())

    @classmethod
    def load(cls, path):
        """Read a state written by :meth:`save` (never unpickles); a ValueError names the file when it is not one."""
        return read_state(cls.from_state_dict, path, cls.STATE_NAME or f"{cls.__name__} state")
