"""Per-model concurrency and rate limits through Prefect global concurrency limits (opt-in with
QUERYLAB_MODEL_LIMITS), observed at the scripted OpenAI server: when requests arrive."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from schemas.models import AgentOptions, Prices
from tasks.core import llm
from tasks.core.llm import AgentConfigError, ChatModel, ResolvedModel, model_limit_names
from tests.fakes.openai_server import ScriptedOpenAIServer, delay, message


def _create_limit(name: str, limit: int, decay: float | None = None) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
            name=name, limit=limit, slot_decay_per_second=decay or 0.0, active=True))


def _model(name: str, srv) -> ResolvedModel:
    return ResolvedModel(name=name, model_id=name, base_url=srv.base_url, api_key="k",
                         prices=Prices(input=0, output=0), context_window=None)


def _arrivals(name: str, n: int, hold_s: float) -> list[float]:
    """Send ``n`` concurrent calls to model ``name`` (each answered after ``hold_s``); return
    the server-side arrival times, sorted."""
    arrivals: list[float] = []

    def responder(body, index):
        arrivals.append(time.monotonic())
        return delay(hold_s, message("ok")) if hold_s else message("ok")

    with ScriptedOpenAIServer(responder) as srv:
        models = [ChatModel(_model(name, srv), AgentOptions()) for _ in range(n)]
        errors: list[BaseException] = []

        def call(i: int) -> None:
            try:
                models[i].complete([{"role": "user", "content": f"q{i}"}], None, 0, 0)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for m in models:
            m.close()
    assert not errors, errors
    return sorted(arrivals)


@pytest.fixture
def limits_on(prefect_harness, monkeypatch):
    monkeypatch.setenv(llm.MODEL_LIMITS_ENV, "prefect")
    llm.forget_model_limits()
    yield
    llm.forget_model_limits()


def test_concurrency_limit_serialises_requests_to_one_model(limits_on, caplog):
    conc, _ = model_limit_names("lim/conc")
    assert conc == "model:lim_conc"
    _create_limit(conc, 1)
    arrivals = _arrivals("lim/conc", 3, 0.8)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) >= 0.7, gaps  # one request in flight at a time
    # another model has no limit: its requests overlap (all three arrive before the first
    # answer), and a warning says the limits are missing
    with caplog.at_level("WARNING", logger="tasks.core.llm"):
        free = _arrivals("lim-free", 3, 0.8)
    assert free[-1] - free[0] < 0.8, free
    assert "neither model:lim-free nor model-rate:lim-free exists" in caplog.text


def test_rate_limit_spaces_requests(limits_on):
    _, rate = model_limit_names("lim-rate")
    _create_limit(rate, 1, decay=2.0)  # one request, then one slot back every 0.5 s
    arrivals = _arrivals("lim-rate", 3, 0)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) >= 0.4, gaps


def test_limits_are_opt_in(monkeypatch):
    monkeypatch.delenv(llm.MODEL_LIMITS_ENV, raising=False)
    with ScriptedOpenAIServer([message("ok")]) as srv:
        model = ChatModel(_model("any", srv))
        assert model.limits is None  # no Prefect call on the request path
        model.close()
    assert llm.model_limits("any", {llm.MODEL_LIMITS_ENV: "off"}) is None
    with pytest.raises(AgentConfigError, match="QUERYLAB_MODEL_LIMITS='sometimes'"):
        llm.model_limits("any", {llm.MODEL_LIMITS_ENV: "sometimes"})


def test_waiting_for_a_slot_past_the_deadline_is_errored(limits_on):
    """QA M1: a trial whose wall time ran out waiting for the model's Prefect concurrency slot
    (other trials held it) is errored (``api_error``), not the agent's ``max_wall_time``."""
    conc, _ = model_limit_names("lim-wait")
    _create_limit(conc, 1)
    with ScriptedOpenAIServer(lambda body, i: delay(3, message("ok"))) as srv:
        holder, waiter = (ChatModel(_model("lim-wait", srv), AgentOptions()) for _ in range(2))
        t = threading.Thread(target=holder.complete,
                             args=([{"role": "user", "content": "hold"}], None, 0, 0))
        t.start()
        time.sleep(0.8)  # the holder has the only slot
        with pytest.raises(llm.LLMCallError) as err:
            waiter.complete([{"role": "user", "content": "wait"}], None, 0, 0,
                            deadline=time.monotonic() + 1.0)
        t.join(30)
        holder.close()
        waiter.close()
    assert err.value.reason == "api_error" and "no slot" in str(err.value)
    assert "model:lim-wait" in str(err.value)
