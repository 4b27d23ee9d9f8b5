"""One error tree: every error is a StepstoneError, builtin bases are kept where callers
catch them, ownership and corrupt-record errors have one engine-neutral base each, and
the module docstring draws every class."""

from __future__ import annotations

import inspect
import pickle

import pytest

import stepstone.exceptions as exc_mod
from stepstone import LLMEngine, Store
from stepstone.durable import claim_run
from stepstone.exceptions import (
    AgentCheckpointCorruptionError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointRecordInvalid,
    ConcurrentGraphResumeError,
    ConcurrentPlanRunError,
    ConcurrentRunError,
    ConfigurationError,
    ConfigurationTypeError,
    CorruptRecordError,
    PlanPaused,
    RunParked,
    StepstoneError,
    StoreError,
    UserError,
)


def _classes() -> list[type[BaseException]]:
    return [
        obj
        for name in exc_mod.__all__
        if inspect.isclass(obj := getattr(exc_mod, name)) and issubclass(obj, BaseException)
    ]


def test_every_error_has_one_root() -> None:
    signals = {PlanPaused, RunParked}
    for cls in _classes():
        if cls in signals or issubclass(cls, Warning):
            continue
        assert issubclass(cls, StepstoneError), cls.__name__
    assert not issubclass(PlanPaused, Exception)  # a signal: `except Exception` lets it through


def test_the_docstring_draws_every_class() -> None:
    doc = exc_mod.__doc__ or ""
    missing = [cls.__name__ for cls in _classes() if cls.__name__ not in doc]
    assert not missing, f"classes missing from the tree in exceptions.py: {missing}"


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (ConcurrentRunError, RuntimeError),
        (ConcurrentPlanRunError, RuntimeError),  # guarantee 30
        (ConcurrentGraphResumeError, RuntimeError),
        (ConfigurationError, ValueError),
        (ConfigurationTypeError, TypeError),
        (ConfigurationTypeError, ValueError),
        (exc_mod.MissingExtraError, ImportError),
        (exc_mod.PlanRuntimeError, RuntimeError),
    ],
)
def test_builtin_bases_callers_catch_are_kept(
    cls: type[BaseException], builtin: type[BaseException]
) -> None:
    assert issubclass(cls, builtin)


def test_ownership_errors_share_an_engine_neutral_base() -> None:
    assert issubclass(ConcurrentPlanRunError, ConcurrentRunError)
    assert issubclass(ConcurrentGraphResumeError, ConcurrentRunError)
    # graph users are never told about a Plan option through a Plan error
    assert not issubclass(ConcurrentGraphResumeError, ConcurrentPlanRunError)


def test_corrupt_records_share_one_base() -> None:
    for cls in (CheckpointCorruptError, CheckpointRecordInvalid, AgentCheckpointCorruptionError):
        assert issubclass(cls, CorruptRecordError)
        assert issubclass(cls, StoreError)
    assert issubclass(CheckpointRecordInvalid, CheckpointError)  # graph users catch this too


def test_misuse_is_a_user_error() -> None:
    assert issubclass(ConfigurationError, UserError)
    assert not issubclass(ConcurrentRunError, UserError)  # a conflict is not misuse


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.__name__)
def test_every_error_pickles(cls: type[BaseException]) -> None:
    if cls is exc_mod.MissingExtraError:
        err: BaseException = cls("psycopg", "postgres")  # type: ignore[call-arg]
    elif issubclass(cls, exc_mod.NodeException):
        err = cls("boom", node_name="n")  # type: ignore[call-arg]
    else:
        err = cls("message naming ids")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err)


def test_kernel_raises_the_neutral_error_for_other_engines() -> None:
    with Store() as store:
        first = claim_run(store, "k", kind="graph-lock", resume=False, first_step=None)
        assert first.run is not None
        with pytest.raises(ConcurrentRunError, match="'k' is owned by live run") as info:
            claim_run(store, "k", kind="graph-lock", resume=False, first_step=None)
        assert type(info.value) is ConcurrentRunError
        assert "on_concurrent" not in str(info.value)  # a Plan option: not for other engines
        first.run.release()


def test_kernel_raises_the_plan_facing_error_for_plans() -> None:
    with Store() as store:
        first = claim_run(store, "p", kind="plan", resume=False, first_step="a")
        assert first.run is not None
        with pytest.raises(ConcurrentPlanRunError, match="on_concurrent='fork'"):
            claim_run(store, "p", kind="plan", resume=True, first_step="a")
        first.run.release()


@pytest.mark.parametrize(
    ("kwargs", "cls"),
    [
        ({"max_turns": 0}, ConfigurationError),
        ({"tool_choice": "parallel"}, ConfigurationError),
        ({"stream_buffer": 0}, ConfigurationError),
        ({"cache": "yes"}, ConfigurationTypeError),
    ],
)
def test_llm_engine_misuse_is_a_configuration_error(
    kwargs: dict[str, object], cls: type[Exception]
) -> None:
    with pytest.raises(cls) as info:
        LLMEngine("claude-sonnet-4-6", **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError | UserError)


def test_unknown_model_names_a_fix() -> None:
    with pytest.raises(ConfigurationError, match="is a provider name"):
        LLMEngine("anthropic")


def test_every_error_has_its_own_stable_category() -> None:
    # guarantee 593
    seen: dict[str, str] = {}
    for cls in _classes():
        if issubclass(cls, Warning):
            continue
        category = cls.__dict__.get("category")
        assert isinstance(category, str), f"{cls.__name__} declares no category of its own"
        assert category.isidentifier() and category == category.lower(), category
        assert category not in seen, f"{cls.__name__} reuses {seen[category]}'s category"
        seen[category] = cls.__name__
    # the strings are part of the API: these never change
    assert exc_mod.ReducerError.category == "reducer_error"
    assert exc_mod.StateValidationError.category == "state_validation_error"
    assert exc_mod.RoutingError.category == "routing_error"
    assert exc_mod.EdgeException.category == "edge_exception"
    assert exc_mod.CheckpointSaveFailed.category == "checkpoint_save_failed"
    assert exc_mod.CheckpointNotFound.category == "checkpoint_not_found"
    assert exc_mod.NodeException.category == "node_exception"


def test_typed_graph_errors_pickle_with_their_attributes() -> None:
    # guarantee 593
    err = exc_mod.ReducerError(
        "refused", node_name="n", field="tags", reducer="append", namespace=("sub",)
    )
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.reducer, back.node_name, back.namespace) == (
        "tags",
        "append",
        "n",
        ("sub",),
    )
    assert isinstance(back, TypeError) and isinstance(back, exc_mod.NodeException)
    mig = exc_mod.CheckpointStateMigrationMissing("no chain", from_version="v1", to_version="v3")
    back_mig = pickle.loads(pickle.dumps(mig))
    assert (back_mig.from_version, back_mig.to_version) == ("v1", "v3")
    saved = exc_mod.CheckpointSaveFailed("disk", invocation_id="i", node_name="n")
    assert pickle.loads(pickle.dumps(saved)).invocation_id == "i"
