"""optuna-dashboard shows a live archspec search: each trial's spec, MACs and status, and the objective names
(issue 32, part 5).  The dashboard's own WSGI app (``optuna_dashboard.wsgi``) is asked what it would show a
browser, on the run's SQLite storage, while nothing else holds the study."""

from __future__ import annotations

import io
import json
import sys

import pytest
from test_search_oracle import TINY_SPACE, _table

from archspec.ir.checked import load_spec
from archspec.search import run_design
from archspec.search._evaluation.latency import architecture_key

optuna_dashboard = pytest.importorskip("optuna_dashboard")  # the test extra installs it; `.[dashboard]` for users


def _get(app, path: str) -> dict:
    env = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1",
           "SERVER_PORT": "8080", "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr}
    status = {}
    body = b"".join(app(env, lambda s, headers, exc_info=None: status.update(code=s)))
    assert status["code"].startswith("200"), (status, body[:500])
    return json.loads(body)


def test_dashboard_shows_each_trials_spec_and_the_objective_names(tmp_path):
    path, points = _table(tmp_path, latency=True)
    outcome = run_design(space=TINY_SPACE, oracle=str(path), fidelity="none", trials=3, protocol={"steps": 80},
                         out=tmp_path / "run", progress=False, sampler="random")
    app = optuna_dashboard.wsgi(outcome.summary["storage"])
    study_id = _get(app, "/api/studies")["study_summaries"][0]["study_id"]
    study = _get(app, f"/api/studies/{study_id}")
    # the default search ranks by val top-1 (issue 82): its first objective is named for that (issue 57)
    assert study["objective_names"] == ["accuracy", "latency_ms"]
    shown = 0
    for trial in study["trials"]:
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        if "spec" not in attrs:
            continue
        spec = load_spec(json.loads(attrs["spec"]) if isinstance(attrs["spec"], str) else attrs["spec"])
        assert architecture_key(spec) == attrs["arch_key"]  # the very design the trial evaluated
        assert {"macs", "status"} <= set(attrs)
        if attrs["status"] == "trained":
            assert 0.0 <= float(attrs["accuracy"]) <= 1.0  # the val top-1 is kept as an attribute
        shown += 1
    assert shown >= 3
