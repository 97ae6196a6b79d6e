"""model.generate's sampling step, the distribution torch.multinomial is handed: softmax of the last position's
logits over the temperature, among the top_k largest (all of them when top_k exceeds the vocabulary), over the ids
below vocab only (a padded vocabulary's extra ids are never drawn). Tiny random model, CPU only."""
import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig

V, KNOWN = 64, 40  # the model's vocabulary, and the ids its codec knows (the rest: padding)


def first_step_probs(model, idx, monkeypatch, **kw):
    """The probabilities generate samples its first new token from."""
    seen, draw = [], torch.multinomial
    monkeypatch.setattr(torch, "multinomial", lambda p, num_samples: seen.append(p.clone()) or draw(p, num_samples))
    model.generate(idx, 1, **kw)
    return seen[0]


@pytest.mark.parametrize("temperature,top_k", [(0.5, 5), (2.0, None), (1.0, 1000)])
def test_a_sampling_step_draws_from_softmax_of_logits_over_temperature_among_the_top_k_known_ids(
        temperature, top_k, monkeypatch):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=V, n_layer=1, n_head=2, n_embd=32, ffn_hidden=64)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(50)  # logits spread over nats: a temperature's effect shows
        idx = torch.randint(0, V, (2, 6))
        logits = model(idx)[0][:, -1, :KNOWN]
    k = min(top_k or KNOWN, KNOWN)  # 1000: more than the vocabulary, so every known id
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.topk(k).indices, True)
    want = F.softmax((logits / temperature).masked_fill(~keep, -float("inf")), dim=-1)
    got = first_step_probs(model, idx, monkeypatch, temperature=temperature, top_k=top_k, vocab=KNOWN)
    assert got.shape == (2, KNOWN) and ((got > 0).sum(-1) == k).all()
    torch.testing.assert_close(got, want)
    assert want.max() < 0.99  # not one-hot: a temperature multiplying instead of dividing would differ
