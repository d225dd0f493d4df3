"""The use cases under the CLI and the Python API, one module for each kind of work; each takes
values and returns plans and records; parsing arguments and printing are the caller's.

    plans          plan, script (review: nothing written or sent), options_of, save
    submissions    prepare, submit, chain, sweep, rerun's checks, cancel
    backlogs       the runs waiting in the backlog, and its mover
    inside         launch, sweep --within (inside an allocation the scheduler gave)
    packs          sweep --pack, pack-run          reruns      rerun
    following      find a job, status, --watch, follow a log
    inspection     timeline, startup, diagnose, logs
    reports        report, plot                    step_profiles   where a step's time went
    spending       usage, balance                  database    db check, backup, recover
    environments   env create, env check           machines    machines, workloads, show,
    exports        export a checkpoint                         schema, machines check

The CLI and the Python API import nothing below this layer: this module says again, for them,
the use cases they call by name and the words they speak (requests, plans, records, states,
limits). It holds no use case of its own.
"""

from __future__ import annotations

from mmm_orch.config.registry import unknown_name as unknown_name
from mmm_orch.limits import MAX_INT as MAX_INT
from mmm_orch.limits import MAX_LINKS as MAX_LINKS
from mmm_orch.planning import Plan as Plan
from mmm_orch.planning import Request as Request
from mmm_orch.planning.cost import hours as hours
from mmm_orch.planning.cost import sweep_cost as sweep_cost
from mmm_orch.planning.occupancy import NOTHING_YET as NOTHING_YET
from mmm_orch.records.db import JobDB as JobDB
from mmm_orch.records.record import PACK_INDEX as PACK_INDEX
from mmm_orch.records.record import JobRecord as JobRecord
from mmm_orch.rendering import render as render
from mmm_orch.schedulers.states import JobState as JobState
from mmm_orch.usecases.plans import check_settings as check_settings
from mmm_orch.usecases.plans import options_of as options_of
from mmm_orch.usecases.plans import plan as plan
from mmm_orch.usecases.plans import save as save
from mmm_orch.usecases.plans import script as script
from mmm_orch.usecases.spending import balance as balance
from mmm_orch.usecases.spending import usage as usage
from mmm_orch.usecases.spending import usage_dicts as usage_dicts
from mmm_orch.usecases.spending import usage_text as usage_text
from mmm_orch.usecases.submissions import cancel as cancel
from mmm_orch.usecases.submissions import chain_links as chain_links
from mmm_orch.usecases.submissions import prepare as prepare
from mmm_orch.usecases.submissions import prepare_plan as prepare_plan
from mmm_orch.usecases.submissions import submit as submit
from mmm_orch.usecases.submissions import submit_chain as submit_chain
from mmm_orch.usecases.submissions import submit_sweep as submit_sweep
from mmm_orch.usecases.submissions import sweep_points as sweep_points
from mmm_orch.usecases.submissions import within_budgets as within_budgets
