import torch

from aligner.generation.sampling import apply_repetition_penalty, filter_logits, sample_from_logits, sample_next


def test_filter_logits_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = filter_logits(logits, 1.0, 2, 1.0)
    assert torch.isinf(top2[0, 2:]).all() and torch.isfinite(top2[0, :2]).all()
    # top_p 0.7: 0.5 is kept (mass before it 0), 0.3 kept (0.5 < 0.7), 0.15 dropped (0.8 >= 0.7).
    nucleus = filter_logits(logits, 1.0, 0, 0.7)
    assert torch.isfinite(nucleus[0, :2]).all() and torch.isinf(nucleus[0, 2:]).all()
    # Temperature 2 halves the logits.
    torch.testing.assert_close(filter_logits(logits, 2.0, 0, 1.0), logits / 2)


def test_inverse_cdf_sampling_follows_the_distribution():
    probs = torch.tensor([0.1, 0.6, 0.0, 0.3])
    logits = probs.log().expand(20000, 4)
    draws = sample_from_logits(logits, torch.rand(20000, 1, generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(draws, minlength=4).float() / 20000
    assert freq[2] == 0
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


def test_sample_next_bans_eos_but_reports_the_policys_own_logprobs():
    logits = torch.log(torch.tensor([[0.9, 0.05, 0.05]])).expand(2000, 3)  # token 0 plays EOS
    eos = torch.tensor([True, False, False])
    uniform = torch.rand(2000, 1, generator=torch.Generator().manual_seed(0))
    banned, banned_logprobs = sample_next(logits, uniform, torch.tensor(True), eos, 1.0, 0, 1.0)
    assert not (banned == 0).any() and set(banned.tolist()) == {1, 2}
    torch.testing.assert_close(banned_logprobs, torch.full((2000,), 0.05).log())  # unmodified distribution
    free, _ = sample_next(logits, uniform, torch.tensor(False), eos, 1.0, 0, 1.0)
    assert 0.85 < (free == 0).float().mean() < 0.95


def test_repetition_penalty_by_hand():
    """Seen tokens: a positive logit is divided by the penalty, a negative one multiplied; unseen ones stay."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0], [2.0, -1.0, 0.5, 0.0]])
    seen = torch.tensor([[True, True, False, False], [False, False, True, True]])
    out = apply_repetition_penalty(logits, seen, 2.0)
    assert out.tolist() == [[1.0, -2.0, 0.5, 0.0], [2.0, -1.0, 0.25, 0.0]]


def test_greedy_takes_the_argmax_after_penalty_and_eos_ban_and_reports_the_policys_logprobs():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]))  # all logits negative
    eos = torch.tensor([False, False, False])
    uniform = torch.tensor([[0.99], [0.0]])  # ignored: greedy draws nothing
    tokens, logprobs = sample_next(logits, uniform, torch.tensor(False), eos, 5.0, 0, 0.1, greedy=True)
    assert tokens.tolist() == [0, 0]
    torch.testing.assert_close(logprobs, torch.tensor([0.5, 0.5]).log())
    # A penalty on token 0 multiplies its negative logit: 1.5 gives log 0.5 * 1.5 = -1.04, still above log 0.3 =
    # -1.20; 2 gives -1.39, below it, and token 1 wins. The log-probs are still the unpenalised policy's.
    seen = torch.tensor([[True, False, False], [True, False, False]])
    kept, _ = sample_next(logits, uniform, torch.tensor(False), eos, 1.0, 0, 1.0, True, 1.5, seen)
    moved, moved_logprobs = sample_next(logits, uniform, torch.tensor(False), eos, 1.0, 0, 1.0, True, 2.0, seen)
    assert kept.tolist() == [0, 0] and moved.tolist() == [1, 1]
    torch.testing.assert_close(moved_logprobs, torch.tensor([0.3, 0.3]).log())
    # The EOS ban applies to greedy choice too.
    banned, _ = sample_next(logits, uniform, torch.tensor(True), torch.tensor([True, False, False]), 1.0, 0, 1.0, True)
    assert banned.tolist() == [1, 1]
