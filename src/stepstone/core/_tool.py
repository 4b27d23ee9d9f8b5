"""Tool: a named callable (function or agent) with a JSON schema for its arguments."""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import re
import typing
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard, runtime_checkable

from pydantic import BaseModel, ConfigDict, create_model

from stepstone.core._checks import check_bool
from stepstone.core._sync import with_idle_loop
from stepstone.core._threads import is_awaitable, to_thread
from stepstone.exceptions import ConfigurationError, ConfigurationTypeError

if TYPE_CHECKING:
    from stepstone.core._envelope import Envelope

__all__ = [
    "AgentLike",
    "Tool",
    "ToolContext",
    "build_tool_map",
    "call_maybe_async",
    "is_agent_like",
    "is_async_callable",
    "tool",
]

InDoubt = Literal["rerun", "fail", "ask"]


@runtime_checkable
class AgentLike(Protocol):
    """What the framework treats as an Agent: a named thing with an engine that runs an
    envelope and can turn itself into a tool.

    Layers below the agent layer (core, engines) may not import ``Agent``; they check
    ``isinstance(x, AgentLike)`` instead.
    """

    name: str
    engine: Any

    def as_tool(self, name: str | None = None) -> Tool:
        """This agent as a tool another agent can call."""
        ...

    async def run(
        self,
        task: Any,
        *,
        context: str | None = None,
        output: type | None = None,
        session: Any = None,
    ) -> Envelope[Any]:
        """Run once and return the result envelope."""
        ...


def is_agent_like(obj: object) -> TypeGuard[AgentLike]:
    """``isinstance(obj, AgentLike)``, answered at once for the usual non-agent (a function).

    A runtime Protocol check costs ~8 us on Python 3.11 (it walks every member), and a Plan
    makes it once per step: that doubled the per-step cost of a Plan without a store."""
    return hasattr(obj, "as_tool") and isinstance(obj, AgentLike)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool learns about the call it is running, through a parameter annotated
    ``ToolContext`` (any name; it is not part of the schema the model sees).

    Attributes:
        idempotency_key: Stable for this call: the same on every replay and resume of the
            run, different for every other call. Pass it to external APIs that deduplicate
            (``Idempotency-Key`` headers). Outside an LLM loop it is a fresh random key.
        run_id: The LLM run the call belongs to (None outside one).
        turn: The loop turn (0-based; None outside a loop).
        index: The call's position in its turn.
        call_id: The model's id for the call.

    Example::

        @tool(in_doubt="fail")
        def charge(amount: int, ctx: ToolContext) -> str:
            return payments.charge(amount, idempotency_key=ctx.idempotency_key)
    """

    idempotency_key: str
    run_id: str | None = None
    turn: int | None = None
    index: int | None = None
    call_id: str | None = None


_tool_context: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "stepstone_tool_context", default=None
)


def bind_tool_context(ctx: ToolContext | None) -> contextvars.Token[ToolContext | None]:
    """Make ``ctx`` the running tool call's context (the LLM engine does it per call)."""
    return _tool_context.set(ctx)


def reset_tool_context(token: contextvars.Token[ToolContext | None]) -> None:
    """Undo :func:`bind_tool_context`."""
    _tool_context.reset(token)


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


@dataclasses.dataclass(kw_only=True)
class Tool:
    """A callable the framework can run by name: a Plan step target or an LLM tool.

    Build one with :func:`tool` / :meth:`Tool.from_function`, or let ``Agent(tools=[fn])``
    wrap plain functions (named after the function). ``agent.as_tool("name")`` wraps an
    Agent.

    Attributes:
        name: The key in the tool map (``Step("name")`` and LLM tool calls use it).
        description: Shown to models; defaults to the function's docstring summary.
        parameters: JSON schema of the arguments, derived from type hints.
        fn: The function to call (sync or async). None for agent tools.
        agent: The Agent behind an ``as_tool`` tool, else None.
        in_doubt: What a durable run does with a call that started before a crash and has
            no recorded outcome: ``"rerun"`` (default: call it again; right for idempotent
            tools and for tools that dedupe on :class:`ToolContext`'s key), ``"fail"``
            (the run fails with :class:`~stepstone.exceptions.EffectInDoubtError` naming
            the call) or ``"ask"`` (the run pauses for a person's approval).
        requires_approval: A durable run pauses before each call of this tool until a
            person approves or refuses it (``Runner.resume(..., approvals=...)``).
        context_param: The parameter that receives a :class:`ToolContext`, if any.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    fn: Callable[..., Any] | None = None
    agent: Any = None
    args_model: type[BaseModel] | None = None
    in_doubt: InDoubt = "rerun"
    requires_approval: bool = False
    context_param: str | None = None
    positional_only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_policy(f"tool {self.name!r}: ", self.in_doubt, self.requires_approval)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        in_doubt: InDoubt = "rerun",
        requires_approval: bool = False,
    ) -> Tool:
        """Wrap ``fn``; its type hints and Google-style docstring give the schema.

        Raises:
            ConfigurationError: an option of the wrong type or value (``in_doubt="maybe"``,
                ``requires_approval="yes"``, ``name=5``), naming it and the fix
                (``ConfigurationTypeError``, also a ``TypeError``, for a wrong type).
        """
        if not callable(fn):
            raise TypeError(f"Tool.from_function needs a callable, got {fn!r}")
        _check_names("Tool.from_function(...): ", name, description)
        tool_name = name or getattr(fn, "__name__", None)
        if not tool_name or tool_name == "<lambda>":
            raise ValueError(
                f"cannot name a tool after {fn!r}; pass name=... (Tool.from_function(fn, name='x'))"
            )
        summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
        context_param = _context_param(fn)
        model = _args_model(fn, tool_name, arg_docs, skip=context_param)
        schema = (
            model.model_json_schema() if model is not None else {"type": "object", "properties": {}}
        )
        schema.pop("title", None)
        _drop_auto_titles(schema)
        return cls(
            name=tool_name,
            description=description if description is not None else summary,
            parameters=schema,
            fn=fn,
            args_model=model,
            in_doubt=in_doubt,
            requires_approval=requires_approval,
            context_param=context_param,
            positional_only=_positional_only(fn),
        )

    @property
    def is_async(self) -> bool:
        """True when calling the function returns an awaitable."""
        return self.fn is not None and is_async_callable(self.fn)

    def definition(self) -> dict[str, Any]:
        """Provider-neutral definition: name, description, JSON schema of parameters."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def validate_args(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Validate and coerce keyword arguments against the schema.

        Raises:
            pydantic.ValidationError: for function tools whose arguments do not validate.
            TypeError: when a required argument of a schema-only tool is missing.

        A function tool refuses names its function does not take, unless it has
        ``**kwargs`` (then they are passed on as they are): a misspelt argument is an error
        the model can correct, not a value dropped without a word.
        """
        if self.args_model is None:
            missing = [k for k in self.parameters.get("required", []) if k not in kwargs]
            if missing:
                raise TypeError(f"tool {self.name!r} is missing required argument(s) {missing}")
            return dict(kwargs)
        validated = self.args_model.model_validate(kwargs)
        args = {name: getattr(validated, name) for name in type(validated).model_fields}
        return {**args, **validated.model_extra} if validated.model_extra else args

    async def run(self, **kwargs: Any) -> Any:
        """Call the tool with keyword arguments (validated); sync functions run in a thread."""
        if self.fn is None:
            return await self.invoke(kwargs)
        return await self.invoke(self.validate_args(kwargs))

    async def invoke(self, args: dict[str, Any]) -> Any:
        """Call the tool with arguments already checked by :meth:`validate_args`."""
        if self.fn is None:
            if self.agent is None:
                raise RuntimeError(f"tool {self.name!r} has neither a function nor an agent")
            task = args.get("task")
            if task is None and len(args) == 1:
                task = next(iter(args.values()))
            env = await self.agent.run(str(task) if task is not None else "")
            if not env.ok:
                raise RuntimeError(f"{env.error.type}: {env.error.message}")
            return env.payload
        if self.context_param is not None:
            ctx = _tool_context.get() or ToolContext(idempotency_key=uuid.uuid4().hex)
            args = {**args, self.context_param: ctx}
        if self.positional_only:
            args = dict(args)
            leading = []
            for pname in self.positional_only:
                if pname not in args:
                    break
                leading.append(args.pop(pname))
            return await call_maybe_async(self.fn, *leading, **args)
        return await call_maybe_async(self.fn, **args)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    in_doubt: InDoubt = "rerun",
    requires_approval: bool = False,
) -> Any:
    """Decorator form of :meth:`Tool.from_function`.

    Example::

        @tool
        def add(a: int, b: int) -> int:
            '''Add two integers.'''
            return a + b

        @tool(in_doubt="fail", requires_approval=True)
        def wire_money(amount: int, ctx: ToolContext) -> str:
            '''Send money (a person approves each call).'''
            return bank.send(amount, idempotency_key=ctx.idempotency_key)
    """

    _check_names("tool(...): ", name, description)
    _check_policy("tool(...): ", in_doubt, requires_approval)

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool.from_function(
            f,
            name=name,
            description=description,
            in_doubt=in_doubt,
            requires_approval=requires_approval,
        )

    return wrap(fn) if fn is not None else wrap


_IN_DOUBT = ("rerun", "fail", "ask")


def _check_policy(where: str, in_doubt: Any, requires_approval: Any) -> None:
    """Refuse an ``in_doubt`` that is not one of the three policies, and a
    ``requires_approval`` that is not a bool (``"no"`` would read as True); ``where``
    prefixes the message (``"tool 'refund': "``)."""
    if not isinstance(in_doubt, str):
        raise ConfigurationTypeError(
            f"{where}in_doubt must be 'rerun', 'fail' or 'ask', got {in_doubt!r} "
            f"({type(in_doubt).__name__}); pass one of them as text, e.g. in_doubt='fail'"
        )
    if in_doubt not in _IN_DOUBT:
        close = in_doubt.strip().lower()
        hint = f"in_doubt={close!r}" if close in _IN_DOUBT else "in_doubt='rerun' (the default)"
        raise ConfigurationError(
            f"{where}in_doubt must be 'rerun', 'fail' or 'ask', got {in_doubt!r}; pass {hint}"
        )
    try:
        check_bool("requires_approval", requires_approval)
    except ConfigurationTypeError as exc:
        raise ConfigurationTypeError(f"{where}{exc}") from None


def _check_names(where: str, name: Any, description: Any) -> None:
    """Refuse a tool ``name`` that is not non-empty text, or a ``description`` not text."""
    if name is not None and (not isinstance(name, str) or not name.strip()):
        error = ConfigurationError if isinstance(name, str) else ConfigurationTypeError
        raise error(
            f"{where}name must be a non-empty str or None (the function's name), got "
            f"{name!r}; pass the name the model calls the tool by, e.g. name='search'"
        )
    if description is not None and not isinstance(description, str):
        raise ConfigurationTypeError(
            f"{where}description must be a str or None (the docstring's summary), got "
            f"{description!r} ({type(description).__name__}); pass text"
        )


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine: a coroutine function, or an object whose
    ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


async def call_maybe_async(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Await ``fn`` when it is async; run it in a worker thread when it is sync (with the
    thread's idle loop as its current loop, for a sync wrapper of an async library)."""
    if is_async_callable(fn):
        return await fn(*args, **kwargs)
    result = await to_thread(with_idle_loop, fn, *args, **kwargs)
    return await result if is_awaitable(result) else result


def _drop_auto_titles(schema: Any) -> None:
    """Remove the titles pydantic derives from field names ("city" → "City"): they cost
    tokens on every request and tell the model nothing the property name does not."""
    if isinstance(schema, list):
        for item in schema:
            _drop_auto_titles(item)
        return
    if not isinstance(schema, dict):
        return
    props = schema.get("properties")
    if isinstance(props, dict):
        for name, prop in props.items():
            if isinstance(prop, dict) and prop.get("title") == name.replace("_", " ").title():
                del prop["title"]
    for key, value in schema.items():
        if key != "properties" or not isinstance(value, dict):
            _drop_auto_titles(value)
        else:
            for prop in value.values():
                _drop_auto_titles(prop)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The summary (first paragraph) and per-argument descriptions of a docstring in any
    style ``docstring_parser`` knows (Google, reST, NumPy, Epydoc); Google by hand without it.
    """
    summary, args = _parse_google(doc)
    try:
        import docstring_parser
    except ImportError:  # pragma: no cover - a core dependency
        return summary, args
    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        return summary, args
    found = {
        p.arg_name.split(" ")[-1].lstrip("*"): " ".join((p.description or "").split())
        for p in parsed.params
        if p.arg_name
    }
    return summary, {**found, **args} if args else found


def _parse_google(doc: str) -> tuple[str, dict[str, str]]:
    lines = doc.splitlines()
    summary_lines: list[str] = []
    for line in lines:
        if not line.strip() or line.lstrip().startswith((":", "@")):  # reST / Epydoc fields
            break
        summary_lines.append(line.strip())
    args: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in lines:
        if _ARGS_HEADER.match(line):
            in_args = True
            continue
        if not in_args:
            continue
        if line.strip() and not line.startswith((" ", "\t")):
            break  # next section
        m = _ARG_LINE.match(line)
        if m and len(line) - len(line.lstrip()) <= 4:
            current = m.group(1).lstrip("*")
            args[current] = m.group(3).strip()
        elif current and line.strip():
            args[current] = f"{args[current]} {line.strip()}".strip()
    return " ".join(summary_lines), args


def _positional_only(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The names of ``fn``'s positional-only parameters, in order (passed by position)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ()
    return tuple(
        n for n, p in sig.parameters.items() if p.kind is inspect.Parameter.POSITIONAL_ONLY
    )


def _context_param(fn: Callable[..., Any]) -> str | None:
    """The parameter annotated :class:`ToolContext`, if any."""
    try:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable hints: no context parameter
        return None
    for pname in sig.parameters:
        if hints.get(pname) is ToolContext:
            return pname
    return None


def _args_model(
    fn: Callable[..., Any], tool_name: str, arg_docs: dict[str, str], *, skip: str | None = None
) -> type[BaseModel] | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable forward refs: fall back to Any
        hints = {}
    fields: dict[str, Any] = {}
    from pydantic import Field

    extra: Literal["allow", "forbid"] = "forbid"
    for pname, param in sig.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = "allow"  # **kwargs takes any other name
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if pname == skip:
            continue
        annotation = hints.get(pname, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, Field(default, description=arg_docs.get(pname) or None))
    safe = re.sub(r"\W", "_", tool_name)
    return create_model(
        f"{safe}_args", __config__=ConfigDict(arbitrary_types_allowed=True, extra=extra), **fields
    )


def build_tool_map(tools: Any) -> dict[str, Tool]:
    """Turn functions, Agents and Tools into a name -> Tool map (names must be unique).

    Functions become tools named after the function, Agents tools named after the agent
    (``agent.as_tool()``).
    """
    from stepstone.exceptions import UserError

    out: dict[str, Tool] = {}
    for item in tools:
        if isinstance(item, Tool):
            t = item
        elif isinstance(item, AgentLike):
            t = item.as_tool()
        elif callable(item):
            t = Tool.from_function(item)
        else:
            raise TypeError(
                f"tools= takes functions, Agents and Tool objects, got {type(item).__name__}: "
                f"{item!r}"
            )
        if t.name in out:
            raise UserError(
                f"two tools are named {t.name!r}; give one another name "
                "(Tool.from_function(fn, name=...) or agent.as_tool('other'))"
            )
        out[t.name] = t
    return out
