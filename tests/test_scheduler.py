"""The scheduler's policy on plain data, no model: admissions within the turn's prefill budget and the free rows,
a long prompt chunked among decoding rows, the hold that lets a burst in before decoding, and who speculates."""

from __future__ import annotations

from collections import deque

from gpt2.serve.scheduler import Admissions, DecodePlan, Scheduler


def admit(
    scheduler: Scheduler, prompts: list[int], *, active: int = 0, part_way: int | None = None
) -> tuple[Admissions[int], deque[int]]:
    """Admissions for prompts given by their lengths (each costs its length)."""
    waiting = deque(prompts)
    return scheduler.admit(waiting, cost=lambda length: length, active=active, part_way_remaining=part_way), waiting


def test_short_prompts_are_admitted_whole_while_they_fit_the_budget_and_the_next_gets_the_rest() -> None:
    admissions, waiting = admit(Scheduler(max_rows=8, prefill_chunk=100), [30, 40, 20, 50])
    assert admissions.whole == [30, 40, 20]  # 90 tokens; the fourth would pass 100 ...
    assert (admissions.chunked, admissions.first_chunk) == (50, 10) and not waiting  # ... so the rest starts it


def test_a_long_prompt_arriving_among_decoding_rows_is_chunked() -> None:
    scheduler = Scheduler(max_rows=8, prefill_chunk=64)
    admissions, waiting = admit(scheduler, [200], active=5)
    assert admissions == Admissions([], chunked=200, first_chunk=64) and not waiting
    # the next turns feed it a chunk each, first; prompts behind it wait for what the chunks leave
    second, waiting = admit(scheduler, [10, 30], active=6, part_way=200 - 64)
    assert second == Admissions([], part_way_chunk=64) and list(waiting) == [10, 30]
    last, waiting = admit(scheduler, [10, 30], active=6, part_way=200 - 3 * 64)
    assert last == Admissions([10, 30], part_way_chunk=8) and not waiting
    # and the rows decode every one of those turns: the chunk bounds their wait
    assert scheduler.decode([False] * 5, running_before=5, admitted=True, waiting=0, part_way=True).step


def test_one_prompt_is_prefilled_in_chunks_at_a_time() -> None:
    admissions, waiting = admit(Scheduler(max_rows=8, prefill_chunk=64), [100, 300], part_way=20)
    assert admissions == Admissions([], part_way_chunk=20) and list(waiting) == [100, 300]


def test_admissions_never_take_more_rows_than_are_free() -> None:
    admissions, waiting = admit(Scheduler(max_rows=4, prefill_chunk=1000), [5, 5, 5, 5], active=2)
    assert admissions.whole == [5, 5] and list(waiting) == [5, 5]
    none, _ = admit(Scheduler(max_rows=4, prefill_chunk=1000), [5], active=4)
    assert none == Admissions([])


def test_a_prompt_with_nothing_to_prefill_costs_nothing() -> None:
    waiting = deque(["cached", "new"])
    costs = {"cached": 0, "new": 50}
    admissions = Scheduler(max_rows=4, prefill_chunk=50).admit(
        waiting, cost=costs.__getitem__, active=0, part_way_remaining=None
    )
    assert admissions.whole == ["cached", "new"]


def test_a_burst_is_admitted_before_the_first_decode_step() -> None:
    scheduler = Scheduler(max_rows=8, prefill_chunk=64)
    assert scheduler.decode([False] * 2, running_before=0, admitted=True, waiting=3, part_way=False) == DecodePlan(
        step=False
    )
    # once rows were decoding, they step every turn, whatever waits
    assert scheduler.decode([False] * 4, running_before=2, admitted=True, waiting=3, part_way=False).step
    # and with every row taken there is nothing to wait for
    assert scheduler.decode([False] * 8, running_before=0, admitted=True, waiting=3, part_way=False).step


def test_a_speculative_row_alone_speculates() -> None:
    plan = Scheduler(max_rows=8, prefill_chunk=64).decode(
        [True], running_before=1, admitted=False, waiting=0, part_way=False
    )
    assert plan == DecodePlan(step=True, speculating=(0,))


def test_a_row_that_may_not_speculate_decodes_plainly_alone() -> None:
    plan = Scheduler(max_rows=8, prefill_chunk=64).decode(
        [False], running_before=1, admitted=False, waiting=0, part_way=False
    )
    assert plan == DecodePlan(step=True)


def test_a_speculative_row_among_others_steps_with_them() -> None:
    """A verification feeds one row several tokens, which the batch runs for a lone row: among others a greedy
    row takes the batch's step (the same tokens: greedy speculation commits plain greedy decoding's)."""
    scheduler = Scheduler(max_rows=8, prefill_chunk=64)
    assert scheduler.decode([True, True], running_before=2, admitted=False, waiting=0, part_way=False) == DecodePlan(
        step=True
    )
    # nor while a request waits or a prompt is part-way prefilled: the next turn takes it into the batch
    assert scheduler.decode([True], running_before=1, admitted=False, waiting=1, part_way=False).speculating == ()
    assert scheduler.decode([True], running_before=1, admitted=False, waiting=0, part_way=True).speculating == ()


def test_no_rows_no_step() -> None:
    assert (
        not Scheduler(max_rows=8, prefill_chunk=64)
        .decode([], running_before=0, admitted=False, waiting=0, part_way=False)
        .step
    )
