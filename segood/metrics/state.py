"""Checks shared by every state a run saves and loads: counts read from a file are untrusted input."""

MAX_PIXELS = 1 << 58  # counts beyond this are no real set (and 20 x a count must stay within int64)


def check_counts(counts, key):
    """Non-negative integer counts whose total stays below MAX_PIXELS (compared as Python integers)."""
    if counts.size and (int(counts.min()) < 0 or int(counts.max()) > MAX_PIXELS):
        raise ValueError(f"accumulator state {key!r} must hold non-negative counts below 2^58")
    total = sum(int(v) for v in counts.ravel()) if counts.size else 0  # Python ints: no wraparound
    if total > MAX_PIXELS:
        raise ValueError(f"accumulator state {key!r} counts {total} pixels in all, more than 2^58")
