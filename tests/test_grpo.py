"""GRPO's loss against TRL's own: on the same weights and the same batch of prompts, completions and rewards, our
`GRPOLoss` gives the loss and the gradients `trl.GRPOTrainer.compute_loss` gives, for every loss type, with and
without the KL penalty, and with a stale policy whose ratios are clipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpt2.rl.loss import GRPOLoss, RolloutBatch, completion_logprobs, group_advantages
from gpt2.weights import load_model
from gpt2.weights.hf import to_hf_tensor

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

G = 4  # completions per prompt
P, C = 5, 6  # prompt and completion columns
EOT = 50256
MAX_COMPLETION = 8  # dr_grpo's denominator

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers on TRL's own config defaults


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random GPT-2 made by transformers (no dropout, so TRL's train mode computes what eval mode does), with
    GPT-2's tokenizer, which TRL needs to exist though the batch is given as ids."""
    from conftest import shared_file

    directory = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():  # biases and LayerNorm gains away from the trivial 0 and 1
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(directory)
    bpe = shared_file("gpt2-bpe/encoder.json").parent
    tokenizer = transformers.GPT2TokenizerFast(vocab_file=str(bpe / "encoder.json"), merges_file=str(bpe / "vocab.bpe"))
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(directory)
    return directory


def fixed_batch(ours_model: torch.nn.Module, stale: bool, beta: float) -> dict[str, torch.Tensor]:
    """Two prompts x G completions of different lengths (some end in end-of-text, the rest are cut at C), their
    rewards' advantages, and (stale) old log-probabilities of an earlier policy, (beta) a reference's."""
    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 50000, (2, P), generator=generator).repeat_interleave(G, dim=0)  # (N, P)
    N = prompts.size(0)
    completions = torch.randint(0, 50000, (N, C), generator=generator)
    lengths = torch.tensor([6, 3, 1, 6, 4, 2, 6, 5])  # tokens through the first end-of-text (or the cap)
    completion_mask = (torch.arange(C) < lengths.unsqueeze(1)).long()
    ends = lengths < C
    completions[ends, lengths[ends] - 1] = EOT
    completions[completion_mask == 0] = EOT  # right padding, as TRL pads with the pad (= end-of-text) token
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 2.0, 2.0, 2.0, 2.0])  # the second group: all equal, advantage 0
    inputs = {
        "prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts), "completion_ids": completions,
        "completion_mask": completion_mask, "advantages": group_advantages(rewards, G),
        "num_items_in_batch": completion_mask.sum(),
    }  # fmt: skip
    ids = torch.cat([prompts, completions], dim=1)
    mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
    with torch.no_grad():
        current = completion_logprobs(ours_model, ids, mask, C)
    if stale:  # an earlier policy: ratios spread well past 1 +- epsilon
        inputs["old_per_token_logps"] = current + 0.4 * torch.randn(current.shape, generator=generator)
    if beta:
        inputs["ref_per_token_logps"] = current + 0.3 * torch.randn(current.shape, generator=generator)
    return inputs


def trl_loss_and_grads(
    directory: Path, inputs: dict[str, torch.Tensor], loss_type: str, beta: float, bias_correction: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    args = trl.GRPOConfig(
        output_dir=str(directory / "trl-out"), report_to=[], use_cpu=True, num_generations=G,
        per_device_train_batch_size=2 * G, max_completion_length=MAX_COMPLETION, beta=beta, epsilon=0.2,
        epsilon_high=0.28, loss_type=loss_type, logging_strategy="no", save_strategy="no",
        use_bias_correction_kl=bias_correction,
        bf16=False,  # TRL's default autocasts to bfloat16; both sides compute in float32 here
    )  # fmt: skip
    dataset = datasets.Dataset.from_list([{"prompt": "unused"}] * (2 * G))
    trainer = trl.GRPOTrainer(model=str(directory), reward_funcs=lambda prompts, completions, **_: [0.0] * len(prompts),
                              args=args, train_dataset=dataset,
                              processing_class=transformers.AutoTokenizer.from_pretrained(directory))  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1  # what its training loop sets: one micro-batch per step
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    loss.backward()
    grads = {name.removeprefix("transformer."): p.grad for name, p in trainer.model.named_parameters()}
    return loss.detach(), grads


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize(("beta", "bias_correction"), [(0.0, True), (0.04, True), (0.04, False)],
                         ids=["no-kl", "kl", "kl-uncorrected"])  # fmt: skip
@pytest.mark.parametrize("stale", [False, True], ids=["on-policy", "stale"])
def test_loss_and_gradients_equal_trl(
    tiny_dir: Path, loss_type: str, beta: float, bias_correction: bool, stale: bool
) -> None:
    ours = load_model(tiny_dir).train()
    inputs = fixed_batch(ours, stale, beta)
    expected_loss, expected_grads = trl_loss_and_grads(tiny_dir, inputs, loss_type, beta, bias_correction)

    empty = torch.empty(0)
    batch = RolloutBatch(
        input_ids=torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1),
        attention_mask=torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
        completion_mask=inputs["completion_mask"], advantages=inputs["advantages"],
        old_logprobs=inputs.get("old_per_token_logps", empty), ref_logprobs=inputs.get("ref_per_token_logps", empty),
    )  # fmt: skip
    loss_fn = GRPOLoss(loss_type=loss_type, beta=beta, epsilon_low=0.2, epsilon_high=0.28,
                       max_completion_length=MAX_COMPLETION, use_bias_correction_kl=bias_correction)  # fmt: skip
    output = loss_fn(ours, batch)
    output.loss.backward()

    torch.testing.assert_close(output.loss.detach(), expected_loss, atol=1e-5, rtol=1e-5)
    if stale:
        assert float(output.clip_fraction) > 0  # the clipped branch is exercised
    for name, parameter in ours.named_parameters():
        if name == "lm_head.weight":
            continue  # tied to transformer.wte.weight: one tensor, its gradient compared there
        theirs = expected_grads[name.removeprefix("transformer.")]
        torch.testing.assert_close(to_hf_tensor(name, parameter.grad), theirs, atol=1e-5, rtol=1e-4, msg=name)
