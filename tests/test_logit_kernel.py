"""The logit methods scored together (:func:`segood.methods.functional.logit_scores`): on the CPU each method's
own function, bit for bit; the fused kernel (CUDA) equal to those functions up to float32 rounding, run here in
Triton's interpreter (a subprocess with TRITON_INTERPRET=1, which Triton reads when it makes a kernel) on logits
with ties, -inf, NaN, a uniform pixel and spreads from 1e-6 to 1e4, at temperatures 1, 0.5, 2 and 1000."""

import pytest
import torch

from segood.methods import functional as fn, get_method
from segood.methods.schedule import score_batch

from interpreter import run_under_triton_interpreter
from networks import tiny_network

FORMS = [("max_softmax", 1.0), ("entropy", 1.0), ("max_logit", 1.0), ("energy", 1.0), ("energy", 2.0),
         ("odin", 1000.0), ("odin_spread", 1000.0), ("odin_spread", 0.5)]


def hard_logits():
    g = torch.Generator().manual_seed(5)
    n, c, h, w = 2, 19, 9, 131  # 1179 pixels an image: two programs of 1024, the second partly filled
    logits = torch.randn(n, c, h, w, generator=g) * torch.logspace(-6, 4, h * w).view(1, 1, h, w)
    logits[0, :, 0, 0] = 3.0  # a uniform pixel: S = C
    logits[0, :3, 0, 1] = 50.0  # three equal maxima
    logits[1, 4, 0, 2] = -float("inf")
    logits[1, :, 0, 3] = -1e30
    logits[1, 7, 0, 3] = 1e30  # one-hot: S = 1
    logits[0, 5, 0, 4] = float("nan")
    return logits


def check_fused():
    from segood.methods import _logits_triton

    logits = hard_logits()
    got = fn._fused_logit_scores(logits, FORMS, kernel=_logits_triton)
    for (name, t), score in zip(FORMS, got):
        want = fn.LOGIT_FORMS[name](logits, t)
        assert torch.equal(score.isnan(), want.isnan()), name
        torch.testing.assert_close(score, want, rtol=2e-5, atol=1e-6, equal_nan=True, msg=name)
        print(f"{name} T={t}: equal", flush=True)
    infinite = torch.zeros(1, 4, 1, 2)  # energy where the largest logit is +inf, and where every one is -inf
    infinite[0, 1, 0, 0], infinite[0, :, 0, 1] = float("inf"), -float("inf")
    energies = fn._fused_logit_scores(infinite, [("energy", 1.0), ("energy", 2.0)], kernel=_logits_triton)
    assert all(e[0, 0].tolist() == [-float("inf"), float("inf")] for e in energies), energies
    print("energy at infinite logits: equal", flush=True)


def test_methods_scored_together_on_the_cpu_equal_each_alone_bit_for_bit():
    model = tiny_network()
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    methods = [get_method(name, **params) for name, params in (
        ("max_softmax", {}), ("entropy", {}), ("max_logit", {}), ("energy", {"temperature": 2.0}),
        ("odin", {"temperature": 1000.0}), ("odin", {"temperature": 10.0, "form": "softmax"}))]
    batch = score_batch(model, x, methods)
    with torch.no_grad():
        output = model(x)
    for method, score in zip(methods, batch.scores):
        assert torch.equal(score, method.from_output(output)), method.name


def test_forms_scored_together_on_the_cpu_equal_each_alone_bit_for_bit_on_hard_logits():
    """One pass for every temperature the forms ask for (entropy's weighted sums beside others' plain ones, ODIN at
    T = 1 beside max softmax) against each form's own function, on logits of several bands with ties, -inf, NaN,
    one-hot and uniform pixels."""
    logits = hard_logits().repeat(1, 1, 30, 4)
    forms = [*FORMS, ("odin", 1.0), ("max_softmax", 1.0)]
    assert len(fn.bands(logits)) > 1
    for (name, t), score in zip(forms, fn.logit_scores(logits, forms)):
        want = fn.LOGIT_FORMS[name](logits, t)
        assert torch.equal(score.isnan(), want.isnan()), name
        assert torch.equal(score.view(torch.int32)[~want.isnan()], want.view(torch.int32)[~want.isnan()]), name


def test_a_method_with_a_formula_of_its_own_is_scored_alone_and_a_renamed_one_together():
    from segood.methods.methods import MaxSoftmax

    class Halved(MaxSoftmax):
        def from_output(self, output):
            return super().from_output(output) / 2

    class Renamed(MaxSoftmax):
        name = "msp"

    assert MaxSoftmax.from_output_together is not None and Halved.from_output_together is None
    model, x = tiny_network(), torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    halved, renamed, plain = score_batch(model, x, [Halved(), Renamed(), get_method("max_softmax")]).scores
    assert torch.equal(halved, plain / 2) and torch.equal(renamed, plain)


def test_unknown_forms_are_refused():
    with pytest.raises(ValueError, match="unknown logit forms"):
        fn.logit_scores(torch.zeros(1, 2, 1, 1), [("softmax", 1.0)])


def test_the_fused_kernel_in_the_interpreter_equals_each_form():
    out = run_under_triton_interpreter(__file__)
    assert out.count("equal") == len(FORMS) + 1, out


if __name__ == "__main__":  # the interpreter test's subprocess: TRITON_INTERPRET=1 is set
    check_fused()


def test_the_cpu_running_maximum_equals_amax():
    """max logit's running maximum over the channels (the CPU's) against ``amax``, bit for bit but for a zero
    maximum's sign: ties, ±inf, NaN, zeros of either sign in every order, one channel, a strided input and
    float16."""
    logits = hard_logits()
    logits[:, :, 1] = -1.0
    signs = torch.randint(0, 2, (2, 19, 131), generator=torch.Generator().manual_seed(6)).bool()
    logits[:, :, 1] = torch.where(signs, -0.0, 0.0)  # zero maxima of random signs
    logits[1, :, 2, 2] = -float("inf")
    logits[1, 3, 2, 3] = float("inf")
    for z in (logits, logits[:, :1], logits[:, :, ::2, 1:], logits.half(), logits[:, :, :0]):
        got, want = fn._channel_max(z), z.amax(dim=1)
        assert got.shape == want.shape and got.dtype == want.dtype
        nan, zero = want.isnan(), want == 0
        assert torch.equal(got.isnan(), nan) and torch.equal(got == 0, zero)
        bits = torch.int16 if got.dtype == torch.float16 else torch.int32
        assert torch.equal(got[~nan & ~zero].view(bits), want[~nan & ~zero].view(bits))


def test_energy_at_infinite_logits_is_that_of_logsumexp():
    """A +inf logit: energy -inf; every logit -inf: +inf; NaN stays NaN (the sums are NaN there)."""
    logits = torch.zeros(1, 4, 1, 4)
    logits[0, 1, 0, 0] = float("inf")
    logits[0, :, 0, 1] = -float("inf")
    logits[0, 2, 0, 2] = float("nan")
    for t in (1.0, 3.0):
        want = torch.logsumexp(logits / t, dim=1).mul_(-t)
        assert torch.equal(fn.energy(logits, t).nan_to_num(), want.nan_to_num())
        assert fn.energy(logits, t)[0, 0, :3].tolist()[:2] == [-float("inf"), float("inf")]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 1000.0])
def test_energy_equals_one_logsumexp_up_to_rounding(temperature):
    """Energy on the CPU (from the exponential sums, band by band) against ``logsumexp`` over the whole map,
    within 4 ulp: logits of several bands with -inf, NaN, one-hot and uniform pixels; an empty map."""
    logits = hard_logits().repeat(1, 1, 30, 4)  # 270 rows of 524 pixels x 19 classes x 2: four bands
    got = fn.energy(logits, temperature)
    want = torch.logsumexp(logits / temperature, dim=1).mul_(-temperature)
    assert len(fn.bands(logits)) > 1
    nan = want.isnan()  # (NaN where a logit is NaN, of either sign)
    assert torch.equal(got.isnan(), nan) and nan.any()
    assert (got[~nan].view(torch.int32) - want[~nan].view(torch.int32)).abs().max() <= 4
    assert fn.energy(logits[:, :, :0], temperature).shape == (2, 0, 524)
