"""The event log's rows for the changes of the step path's own statements, written by those
statements (ADR 13).

Every other change is logged by the deferred row triggers of migrations 0011 and 0041, which
call a function and run a statement for each event at commit. The claim and checkpoint
statements, which make most changes, append their events in CTEs of their own instead: a row
they change is marked by flipping its ``logged_inline``, and the triggers skip a change whose
mark moved. Only autocommitted statements do this. The job's counter is the last lock such a
statement takes, and a transaction would hold it while it takes others, where a trigger takes
it at commit; a statement run inside a transaction leaves its changes to the triggers.

The statements that store jobs log each job's first event the same way (``stored``).

The events are those the triggers would have written: the same kinds and bodies, numbered
from the job's counter in the order the triggers would have fired (the statement's changes in
the order its CTEs make them), with the job's listeners notified if there are any. They share
one row (ADR 20): the index entries of a row are the same whatever it holds.
"""

from service.platform.constants import EVENTS_CHANNEL
from service.platform.states import JobStatus, StepStatus


def notify(job_id: str) -> str:
    """Tell the log's listeners that job ``job_id`` (an SQL expression) has news, if any listen
    (ADR 19): PostgreSQL holds one lock for the whole database from a notifying commit's record
    until its flush, so a notification no one hears would cost every commit its shared flush.
    A listener registers before it reads, and waits out the statements that began before it did."""
    return (
        "CASE WHEN EXISTS (SELECT 1 FROM event_listeners)"
        f" THEN pg_notify('{EVENTS_CHANNEL}', {job_id}::text) END"
    )


def mark(row: str) -> str:
    """What a statement that logs its change itself sets on the changed row ``row`` (a table
    or its alias): the triggers of the log, and the dependency trigger, fire only when the
    mark is unchanged."""
    return f"logged_inline = NOT {row}.logged_inline"


RETURNS_JOB = "trigger, error, owner, pipeline"
"""What a CTE that changes a job's row returns for ``job_event`` and ``dependents``; one that
changes a step row returns its ``step_id``, ``attempts`` and ``round`` for ``step_event``."""


def step_event(order: int, status: StepStatus, cte: str, more: str = "") -> str:
    """The event of each step row the CTE ``cte`` moved to ``status`` (non-shard rows only,
    with no error: a claim or a success), as ``flowbeat_step_event`` builds it; ``more``, a
    ``jsonb`` expression, joins its body."""
    body = f"jsonb_build_object('attempt', {cte}.attempts, 'round', {cte}.round)"
    return f"""SELECT {order} AS ord, 'step.{status}'::text AS kind, {cte}.step_id::text,
               {body}{f" || {more}" if more else ""} AS data
          FROM {cte}"""


def job_event(order: int, status: JobStatus, cte: str) -> str:
    """The event of the job row the CTE ``cte`` moved to ``status``, as
    ``flowbeat_job_event`` builds it."""
    return f"""SELECT {order}, 'job.{status}'::text, NULL::text,
               jsonb_build_object('status', '{status}', 'trigger', {cte}.trigger)
               || CASE WHEN {cte}.error IS NULL THEN '{{}}'::jsonb
                       ELSE jsonb_build_object('error', {cte}.error) END
          FROM {cte}"""


STORED_LOGGED = "logged_inline"
"""The column a statement that stores jobs and logs their first events itself sets true
(``stored``): ``jobs_created_event`` fires only for a job stored otherwise."""


def stored() -> str:
    """The CTEs ``counted`` and ``queued`` that log the first event of each job the statement's
    ``new_job`` CTE stored (returning its ``id``, ``status`` and ``trigger``) and start its
    counter. Safe inside a transaction, unlike the other events here: no one else can see the
    new job, so no one can wait for the counter's lock while the transaction takes others."""
    return f""", counted AS (
        INSERT INTO job_event_seqs (job_id, seq) SELECT id, 1 FROM new_job
    ), queued AS (
        INSERT INTO job_events (job_id, seq, kind, step_id, data, created_at)
        SELECT id, 1, 'job.' || status, NULL,
               jsonb_build_object('status', status, 'trigger', trigger), clock_timestamp()
          FROM new_job
        RETURNING {notify("job_id")}
    )"""


def dependents(cte: str) -> str:
    """The CTE ``dependents`` that queues the success of the job the CTE ``cte`` succeeded
    when a pipeline of its owner waits for it, as ``flowbeat_queue_dependents`` does."""
    return f"""dependents AS (
        INSERT INTO dependency_queue (upstream_job_id)
        SELECT %(job_id)s FROM {cte}
         WHERE EXISTS (SELECT 1 FROM pipeline_triggers
                        WHERE owner = {cte}.owner AND upstream = {cte}.pipeline)
        ON CONFLICT DO NOTHING
        RETURNING pg_notify('flowbeat_schedules', 'dependency')
    )"""


def logged(*events: str) -> str:
    """The CTEs ``changes``, ``numbered`` and ``logged`` that append the events the queries
    ``events`` yield (``step_event``, ``job_event``) for the job ``%(job_id)s`` in one row
    (ADR 20): its columns hold the last, numbered where the job's counter is moved on to by
    their number, and ``more`` those before it, in order. The job's counter exists from its
    first event, written when the job was inserted."""
    return f"""changes AS (
        SELECT c.*, row_number() OVER (ORDER BY c.ord) AS place, count(*) OVER () AS events
          FROM ({" UNION ALL ".join(events)}) AS c
    ), numbered AS (
        UPDATE job_event_seqs AS q SET seq = q.seq + n.events
          FROM (SELECT count(*) AS events FROM changes) AS n
         WHERE q.job_id = %(job_id)s AND n.events > 0
        RETURNING q.seq AS last, {notify("q.job_id")}
    ), logged AS (
        INSERT INTO job_events (job_id, seq, kind, step_id, data, more, created_at)
        SELECT %(job_id)s, b.last, c.kind, c.step_id, c.data,
               (SELECT jsonb_agg(jsonb_build_object('kind', e.kind, 'step_id', e.step_id,
                                                    'data', e.data) ORDER BY e.place)
                  FROM changes AS e WHERE e.place < c.place),
               clock_timestamp()
          FROM numbered AS b CROSS JOIN changes AS c
         WHERE c.place = c.events
    )"""
