"""The store conformance suite: every backend must pass these tests unchanged.

Use it from a test module of your own with a ``store_spec`` fixture::

    import pytest
    from stepstone.testing.store_conformance import *  # noqa: F403
    from stepstone.testing.store_conformance import StoreSpec

    @pytest.fixture
    def store_spec(tmp_path):
        return StoreSpec(name="sqlite", args={"db": str(tmp_path / "s.sqlite")})

The tests are grouped by concern: key/value entries (``_values``), run records
(``_runs``), ownership and leases (``_ownership``), several processes (``_processes``),
timers, messages, events and streams (``_extras``), the webhook outbox (``_webhooks``).
``StoreSpec.args`` are the keyword arguments of ``Store(...)``; ``multiprocess`` says whether
several OS processes can share the store (not for the in-memory backend).
"""

from __future__ import annotations

from stepstone.testing.store_conformance._extras import (
    test_a_stale_commit_writes_none_of_its_records,
    test_a_waiter_is_woken_by_a_message_an_event_or_a_stream_value,
    test_concurrent_appends_take_distinct_offsets,
    test_deleting_a_run_deletes_its_records_and_a_fresh_start_keeps_its_mail,
    test_events_keep_the_last_value_and_streams_append_at_the_next_offset,
    test_messages_are_kept_in_send_order_and_consumed_once_with_a_commit,
    test_notify_run_wakes_the_runs_waiters,
    test_timers_are_set_and_cleared_with_commits,
)
from stepstone.testing.store_conformance._ownership import (
    test_claim_live_run_refused_across_store_objects,
    test_lease_renew_and_expiry_takeover,
)
from stepstone.testing.store_conformance._processes import (
    test_cas_race_across_processes,
)
from stepstone.testing.store_conformance._runs import (
    test_claim_empty_claims_only_a_key_holding_nothing,
    test_claim_writes_a_fresh_runs_first_rows_with_it,
    test_commit_is_atomic_and_versioned,
    test_commit_writes_same_key_twice_last_wins,
    test_delete_removes_run_and_journal,
    test_items_are_pairs_with_checkpoints,
    test_journal_rows_carry_when_their_work_started_and_committed,
    test_journal_rows_read_one_by_one,
    test_run_key_refuses_plain_value_ops,
)
from stepstone.testing.store_conformance._spec import StoreSpec
from stepstone.testing.store_conformance._values import (
    test_a_closed_store_refuses_every_read_and_write,
    test_a_key_with_a_nul_character_is_refused_before_anything_is_written,
    test_async_twins,
    test_cas_absent_and_json_equality,
    test_cas_matches_a_dict_model,
    test_context_manager_closes,
    test_in_and_iteration_see_values_and_checkpoints,
    test_keys_items_prefix_is_exact,
    test_pydantic_values_persist_as_model_dump,
    test_read_only_open_reads_and_refuses_writes,
    test_read_write_delete_roundtrip,
    test_unserializable_value_is_stringified_with_warning,
)
from stepstone.testing.store_conformance._webhooks import (
    test_webhook_outbox_records_lists_and_swaps_deliveries,
)

__all__ = [
    "StoreSpec",
    "test_a_closed_store_refuses_every_read_and_write",
    "test_a_key_with_a_nul_character_is_refused_before_anything_is_written",
    "test_a_stale_commit_writes_none_of_its_records",
    "test_a_waiter_is_woken_by_a_message_an_event_or_a_stream_value",
    "test_async_twins",
    "test_cas_absent_and_json_equality",
    "test_cas_matches_a_dict_model",
    "test_cas_race_across_processes",
    "test_claim_empty_claims_only_a_key_holding_nothing",
    "test_claim_live_run_refused_across_store_objects",
    "test_claim_writes_a_fresh_runs_first_rows_with_it",
    "test_commit_is_atomic_and_versioned",
    "test_commit_writes_same_key_twice_last_wins",
    "test_concurrent_appends_take_distinct_offsets",
    "test_context_manager_closes",
    "test_delete_removes_run_and_journal",
    "test_deleting_a_run_deletes_its_records_and_a_fresh_start_keeps_its_mail",
    "test_events_keep_the_last_value_and_streams_append_at_the_next_offset",
    "test_in_and_iteration_see_values_and_checkpoints",
    "test_items_are_pairs_with_checkpoints",
    "test_journal_rows_carry_when_their_work_started_and_committed",
    "test_journal_rows_read_one_by_one",
    "test_keys_items_prefix_is_exact",
    "test_lease_renew_and_expiry_takeover",
    "test_messages_are_kept_in_send_order_and_consumed_once_with_a_commit",
    "test_notify_run_wakes_the_runs_waiters",
    "test_pydantic_values_persist_as_model_dump",
    "test_read_only_open_reads_and_refuses_writes",
    "test_read_write_delete_roundtrip",
    "test_run_key_refuses_plain_value_ops",
    "test_timers_are_set_and_cleared_with_commits",
    "test_unserializable_value_is_stringified_with_warning",
    "test_webhook_outbox_records_lists_and_swaps_deliveries",
]
