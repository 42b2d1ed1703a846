"""The store's schema, as numbered migrations. ``PRAGMA user_version`` says which have run."""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: the job queue, trajectories, scores, consumers, policies, key-value state.
    """
    CREATE TABLE groups (
        id INTEGER PRIMARY KEY,
        env TEXT NOT NULL,
        seed INTEGER NOT NULL,
        difficulty INTEGER NOT NULL,
        agent TEXT NOT NULL,
        size INTEGER NOT NULL,
        source TEXT NOT NULL,
        created_at REAL NOT NULL,
        done_seq INTEGER UNIQUE
        -- set when the group's last job ends (done or failed): the order whole groups are streamed in
    );
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY,
        group_id INTEGER NOT NULL REFERENCES groups(id),
        env TEXT NOT NULL,
        seed INTEGER NOT NULL,
        difficulty INTEGER NOT NULL,
        agent TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_expires REAL,
        policy_version INTEGER NOT NULL DEFAULT 0,
        source TEXT NOT NULL,
        last_error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX jobs_by_state ON jobs(state, id);
    CREATE INDEX jobs_by_lease ON jobs(state, lease_expires);
    CREATE TABLE trajectories (
        id INTEGER PRIMARY KEY REFERENCES jobs(id),
        seq INTEGER NOT NULL UNIQUE,
        group_id INTEGER NOT NULL,
        env TEXT NOT NULL,
        env_version TEXT NOT NULL,
        seed INTEGER NOT NULL,
        difficulty INTEGER NOT NULL,
        agent TEXT NOT NULL,
        policy_version INTEGER NOT NULL,
        reward REAL NOT NULL,
        passed INTEGER NOT NULL,
        status TEXT NOT NULL,
        reasons TEXT NOT NULL,
        flags TEXT NOT NULL,
        verifier_version TEXT NOT NULL,
        body BLOB NOT NULL,
        node TEXT NOT NULL,
        finished_at REAL NOT NULL
    );
    CREATE INDEX trajectories_by_env ON trajectories(env, difficulty);
    CREATE INDEX trajectories_by_group ON trajectories(group_id);
    CREATE TABLE failures (
        id INTEGER PRIMARY KEY,
        job_id INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        error TEXT NOT NULL,
        final INTEGER NOT NULL,
        at REAL NOT NULL
    );
    CREATE TABLE scores (
        trajectory_id INTEGER NOT NULL REFERENCES trajectories(id),
        verifier_version TEXT NOT NULL,
        reward REAL NOT NULL,
        passed INTEGER NOT NULL,
        status TEXT NOT NULL,
        reasons TEXT NOT NULL,
        flags TEXT NOT NULL,
        scored_at REAL NOT NULL,
        PRIMARY KEY (trajectory_id, verifier_version)
    );
    CREATE TABLE consumers (
        name TEXT PRIMARY KEY,
        acked_seq INTEGER NOT NULL DEFAULT 0,
        updated_at REAL NOT NULL
    );
    CREATE TABLE policies (
        version INTEGER PRIMARY KEY,
        sha256 TEXT NOT NULL UNIQUE,
        size INTEGER NOT NULL,
        blob BLOB,
        uri TEXT,
        created_at REAL NOT NULL
    );
    CREATE TABLE state (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    # 2: a group's last job ending asks whether any of its jobs is still queued or leased; and
    # the lease index holds only leased jobs. Partial indexes: a job that ends leaves them, so the
    # millions of done jobs cost neither index a write.
    """
    CREATE INDEX jobs_open_by_group ON jobs(group_id) WHERE state IN ('queued', 'leased');
    DROP INDEX jobs_by_lease;
    CREATE INDEX jobs_leased_by_expiry ON jobs(lease_expires) WHERE state = 'leased';
    """,
    # 3: a policy's content lives in a file under the data directory (``policies/<sha256>``, written
    # as it arrives), no longer in a blob that had to be held whole: ``file`` names it. Rows an older
    # farmd stored with a blob keep it, and are still served from it.
    """
    ALTER TABLE policies ADD COLUMN file TEXT;
    """,
    # 4: a consumer's cursors are keyed by (name, kind), not by a "NAME#groups" string (which let a
    # consumer called "x#groups" move x's group cursor); each finished group keeps the running total of
    # trajectories in groups finished up to it, so a group cursor says in one lookup how many
    # trajectories it has passed (what trainer demand is counted in).
    """
    CREATE TABLE consumers_by_kind (
        name TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('trajectories', 'groups')),
        acked_seq INTEGER NOT NULL DEFAULT 0,
        updated_at REAL NOT NULL,
        PRIMARY KEY (name, kind)
    );
    INSERT INTO consumers_by_kind(name, kind, acked_seq, updated_at)
        SELECT CASE WHEN name LIKE '%#groups' THEN substr(name, 1, length(name) - 7) ELSE name END,
               CASE WHEN name LIKE '%#groups' THEN 'groups' ELSE 'trajectories' END, acked_seq, updated_at
        FROM consumers;
    DROP TABLE consumers;
    ALTER TABLE consumers_by_kind RENAME TO consumers;
    ALTER TABLE groups ADD COLUMN done_total INTEGER;
    WITH counted AS (
        SELECT g.id, g.done_seq, (SELECT COUNT(*) FROM trajectories t WHERE t.group_id = g.id) AS n
        FROM groups g WHERE g.done_seq IS NOT NULL
    ), running AS (
        SELECT id, SUM(n) OVER (ORDER BY done_seq) AS total FROM counted
    )
    UPDATE groups SET done_total = (SELECT total FROM running WHERE running.id = groups.id)
    WHERE done_seq IS NOT NULL;
    """,
    # 5: runs are resources (CreateRun, GetRun, ListRuns, CancelRun): each group and trajectory names the
    # run that queued it (0: a trainer's demand, or a group queued before runs were kept). Trajectory
    # bodies written from here on hold the typed record (task as posed, conversation, turns with token
    # ids and logprobs, sampling parameters); older bodies are read as they are and upgraded on read.
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        env TEXT NOT NULL,
        agent TEXT NOT NULL,
        rollouts INTEGER NOT NULL,
        group_size INTEGER NOT NULL,
        cancelled INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        finished_at REAL
    );
    ALTER TABLE groups ADD COLUMN run_id INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX groups_by_run ON groups(run_id) WHERE run_id != 0;
    ALTER TABLE trajectories ADD COLUMN run_id INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX trajectories_by_run ON trajectories(run_id, seq) WHERE run_id != 0;
    """,
    # 6: a job put back in the queue after a transient failure waits out its backoff: ``not_before`` is the
    # earliest time it may be leased again (0: at once, as every job queued before this was). How long
    # is the scheduler's retry policy; the store only keeps the time.
    """
    ALTER TABLE jobs ADD COLUMN not_before REAL NOT NULL DEFAULT 0;
    """,
    # 7: policies are published to a named line: ``torch:NAME`` jobs run the version last published to
    # NAME, and a trainer's staleness counts publications to its own line since a trajectory's version.
    # A publication is a row of its own: the same content published again (a trainer resumed from a
    # checkpoint) is the same version, and becomes its line's current one again. Versions stay one
    # sequence across names; policies published before names are the line "", in version order.
    """
    ALTER TABLE policies ADD COLUMN name TEXT NOT NULL DEFAULT '';
    CREATE TABLE publications (
        seq INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        version INTEGER NOT NULL REFERENCES policies(version),
        at REAL NOT NULL
    );
    INSERT INTO publications(name, version, at) SELECT name, version, created_at FROM policies ORDER BY version;
    """,
    # 8: the intake funnel. A submission is one version of a contributed environment (its package kept
    # whole, so an approved version can be served and re-checked); its findings and costs are kept per
    # round (a re-review is another round). Reputation is an append-only ledger; a contributor row holds
    # only what cannot be summed (a tanked reputation is for good). A quarantined environment's
    # trajectories stay stored but leave trainer streams; each one withdrawn is a row consumers are told of.
    """
    CREATE TABLE submissions (
        id INTEGER PRIMARY KEY,
        contributor TEXT NOT NULL,
        name TEXT NOT NULL,
        version TEXT NOT NULL,
        domain TEXT NOT NULL,
        kind TEXT NOT NULL,
        levels INTEGER NOT NULL,
        digest TEXT NOT NULL,
        package BLOB NOT NULL,
        bounty_id INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL,
        tier INTEGER NOT NULL DEFAULT 1,
        detail TEXT NOT NULL DEFAULT '',
        seeds INTEGER NOT NULL,
        attack_budget INTEGER NOT NULL,
        mutants INTEGER NOT NULL DEFAULT 0,
        mutants_killed INTEGER NOT NULL DEFAULT 0,
        rounds INTEGER NOT NULL DEFAULT 1,
        library TEXT NOT NULL DEFAULT '',
        -- the exploit library tier 2 ran (a fingerprint): an accepted version is attacked again when it grows
        reviewer TEXT NOT NULL DEFAULT '',
        review_note TEXT NOT NULL DEFAULT '',
        first_look_at REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        decided_at REAL,
        UNIQUE (name, version)
    );
    CREATE INDEX submissions_by_state ON submissions(state, id);
    CREATE INDEX submissions_by_contributor ON submissions(contributor, id);
    CREATE TABLE findings (
        submission_id INTEGER NOT NULL REFERENCES submissions(id),
        round INTEGER NOT NULL,
        tier INTEGER NOT NULL,
        check_name TEXT NOT NULL,
        evidence TEXT NOT NULL,
        fix TEXT NOT NULL,
        blocking INTEGER NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX findings_by_submission ON findings(submission_id, round);
    CREATE TABLE intake_costs (
        submission_id INTEGER NOT NULL REFERENCES submissions(id),
        round INTEGER NOT NULL,
        tier INTEGER NOT NULL,
        box_cpu_s REAL NOT NULL DEFAULT 0,
        box_wall_s REAL NOT NULL DEFAULT 0,
        box_calls INTEGER NOT NULL DEFAULT 0,
        attacker_tokens INTEGER NOT NULL DEFAULT 0,
        review_s REAL NOT NULL DEFAULT 0,
        at REAL NOT NULL
    );
    CREATE INDEX intake_costs_by_submission ON intake_costs(submission_id);
    CREATE TABLE contributors (
        name TEXT PRIMARY KEY,
        tanked INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL
    );
    CREATE TABLE ledger (
        seq INTEGER PRIMARY KEY,
        contributor TEXT NOT NULL,
        delta REAL NOT NULL,
        reason TEXT NOT NULL,
        submission_id INTEGER NOT NULL DEFAULT 0,
        at REAL NOT NULL
    );
    CREATE INDEX ledger_by_contributor ON ledger(contributor, seq);
    CREATE TABLE bounties (
        id INTEGER PRIMARY KEY,
        domain TEXT NOT NULL,
        requirements TEXT NOT NULL,
        payout_min REAL NOT NULL,
        payout_max REAL NOT NULL,
        wanted INTEGER NOT NULL,
        min_reputation REAL NOT NULL,
        posted_by TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE claims (
        bounty_id INTEGER NOT NULL REFERENCES bounties(id),
        contributor TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (bounty_id, contributor)
    );
    CREATE TABLE payouts (
        submission_id INTEGER PRIMARY KEY REFERENCES submissions(id),
        bounty_id INTEGER NOT NULL,
        contributor TEXT NOT NULL,
        usd REAL NOT NULL,
        at REAL NOT NULL
    );
    CREATE TABLE quarantined_envs (
        env TEXT PRIMARY KEY,
        submission_id INTEGER NOT NULL,
        reason TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE TABLE withdrawals (
        seq INTEGER PRIMARY KEY,
        trajectory_id INTEGER NOT NULL,
        env TEXT NOT NULL,
        reason TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 9: the console's plots read trajectories by time (activity per bucket, throughput over the last
    # minute) and one policy's in order (its learning curve): without these, every look reads the table.
    """
    CREATE INDEX trajectories_by_time ON trajectories(finished_at);
    CREATE INDEX trajectories_by_agent ON trajectories(agent, seq);
    """,
    # 10: what Atropos environments push (``farmd.atropos``): each scored group as pushed, where it stands
    # (buffered, queued, cut into a batch, served, or dropped by a reset) and the batch it went into. The
    # trainer's registration, the environments and the step counter are one JSON value in ``state``.
    """
    CREATE TABLE atropos_groups (
        id INTEGER PRIMARY KEY,
        env_id INTEGER,
        size INTEGER NOT NULL,
        state TEXT NOT NULL,
        batch INTEGER,
        payload BLOB NOT NULL,
        pushed_at REAL NOT NULL
    );
    CREATE INDEX atropos_groups_by_state ON atropos_groups(state, id);
    """,
    # 11: groups made from farm's own rollouts (for Atropos trainers) are told apart from pushed ones: how many
    # wait is what paces taking more from farm's delivery.
    """
    ALTER TABLE atropos_groups ADD COLUMN source TEXT NOT NULL DEFAULT 'pushed';
    """,
    # 12: a name belongs to the credential that made it (``farmd.store.names``): node names, consumer cursors,
    # the Atropos trainer's registration and environment ids, claimed by their first use, refused to any other
    # credential, reassigned by an operator. Kept here so a restart hands no name to whoever speaks first;
    # names in use before this (no row) go to the first credential that uses them after.
    """
    CREATE TABLE names (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        credential TEXT NOT NULL,
        claimed_at REAL NOT NULL,
        assigned_by TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (kind, name)
    );
    """,
    # 13: a joined node reports results; it does not decide what is true. A trajectory says whose verdict its
    # reward is (``verified_by``: local, node:NAME, coordinator, external; '' before this). A known-answer canary
    # group tests one node (``groups.canary`` names it, ``jobs.for_node`` keeps its jobs for that node alone):
    # its results are checked and never stored as trajectories, and the group never finishes, so no stream,
    # listing, task bank or pass rate sees one. A group one of whose results was withdrawn (its node was
    # quarantined) is ``withheld``: whole-group streams leave it out. Quarantined nodes are kept, so a restart
    # keeps them out; each check of a node's result by the coordinator is a row (the evidence an operator reads).
    """
    ALTER TABLE trajectories ADD COLUMN verified_by TEXT NOT NULL DEFAULT '';
    ALTER TABLE groups ADD COLUMN canary TEXT;
    ALTER TABLE groups ADD COLUMN withheld INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN for_node TEXT;
    CREATE INDEX jobs_for_node ON jobs(for_node, state) WHERE for_node IS NOT NULL;
    CREATE INDEX withdrawals_by_trajectory ON withdrawals(trajectory_id);
    CREATE TABLE quarantined_nodes (
        name TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE TABLE node_checks (
        job_id INTEGER PRIMARY KEY,
        node TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('reverify', 'canary')),
        outcome TEXT NOT NULL CHECK (outcome IN ('agreed', 'disagreed', 'inconclusive')),
        detail TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX node_checks_by_node ON node_checks(node, at);
    """,
    # 14: a trajectory's row holds its CURRENT verdict, the one every reader shows (a withdrawal, or a rescore under a
    # newer verifier version, replaces what listings, exports, pass rates and the task bank read); the verdict it
    # was first given moves to its score history (kind 'first') the first time a later one comes. ``verdict_version``
    # names the score that is current (0: the first verdict): scores are numbered by ``seq``, which only grows
    # across the store, so "what changed since an export" is one range of ``trajectories_by_verdict``. A score given
    # after its trajectory was withdrawn, or one that is not a verdict (an error), is kept but never current
    # ('kept'). The table is made again for its ``seq`` and its keys: one score per verifier version as before, and
    # the first verdict beside a later one under the same version (a node's word and the coordinator's check of
    # it). Rows an older farmd wrote are sorted in: the first verdict, then each score, current unless it came
    # after its trajectory's withdrawal.
    """
    CREATE TABLE scores_by_seq (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        trajectory_id INTEGER NOT NULL REFERENCES trajectories(id),
        verifier_version TEXT NOT NULL,
        reward REAL NOT NULL,
        passed INTEGER NOT NULL,
        status TEXT NOT NULL,
        reasons TEXT NOT NULL,
        flags TEXT NOT NULL,
        scored_at REAL NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('first', 'current', 'kept'))
    );
    INSERT INTO scores_by_seq(trajectory_id, verifier_version, reward, passed, status, reasons, flags, scored_at, kind)
    SELECT trajectory_id, verifier_version, reward, passed, status, reasons, flags, at, kind FROM (
        SELECT t.id AS trajectory_id, t.verifier_version, t.reward, t.passed, t.status, t.reasons, t.flags,
               t.finished_at AS at, 'first' AS kind, 0 AS late, 0 AS n
        FROM trajectories t WHERE EXISTS (SELECT 1 FROM scores s WHERE s.trajectory_id = t.id)
        UNION ALL
        SELECT s.trajectory_id, s.verifier_version, s.reward, s.passed, s.status, s.reasons, s.flags, s.scored_at,
               CASE WHEN s.status = 'ok' AND NOT EXISTS (
                   SELECT 1 FROM scores w, json_each(CASE WHEN json_valid(w.flags) THEN w.flags ELSE '[]' END) f
                   WHERE w.trajectory_id = s.trajectory_id AND f.value = 'withdrawn'
                   AND (w.scored_at < s.scored_at OR (w.scored_at = s.scored_at AND w.rowid < s.rowid)))
               THEN 'current' ELSE 'kept' END, 1, s.rowid
        FROM scores s
    ) ORDER BY at, late, n;
    DROP TABLE scores;
    ALTER TABLE scores_by_seq RENAME TO scores;
    CREATE INDEX scores_by_trajectory ON scores(trajectory_id, seq);
    CREATE UNIQUE INDEX scores_one_per_version ON scores(trajectory_id, verifier_version) WHERE kind != 'first';
    CREATE UNIQUE INDEX scores_one_first ON scores(trajectory_id) WHERE kind = 'first';
    ALTER TABLE trajectories ADD COLUMN verdict_version INTEGER NOT NULL DEFAULT 0;
    UPDATE trajectories SET (reward, passed, status, reasons, flags, verifier_version, verdict_version) = (
        SELECT s.reward, s.passed, s.status, s.reasons, s.flags, s.verifier_version, s.seq FROM scores s
        WHERE s.trajectory_id = trajectories.id AND s.kind = 'current' ORDER BY s.seq DESC LIMIT 1)
    WHERE id IN (SELECT trajectory_id FROM scores WHERE kind = 'current');
    CREATE INDEX trajectories_by_verdict ON trajectories(verdict_version) WHERE verdict_version > 0;
    """,
    # 15: a policy's content is kept only while something can still use it (a job queued or leased for its version,
    # the newest versions of its line, an operator's pin); its row (hash, size, line, times) is kept for good.
    # ``pinned_at``: an operator keeps it whatever else holds (``farmctl policy pin``); ``removed_at`` and
    # ``removed_why``: when its content went and why (GetPolicy says so); ``file`` and ``blob`` are then NULL.
    # Publishing the same content again restores it. The partial index holds only versions with content, so a
    # sweep reads those, never every version ever published.
    """
    ALTER TABLE policies ADD COLUMN pinned_at REAL;
    ALTER TABLE policies ADD COLUMN removed_at REAL;
    ALTER TABLE policies ADD COLUMN removed_why TEXT;
    CREATE INDEX policies_with_content ON policies(version)
        WHERE removed_at IS NULL AND (file IS NOT NULL OR blob IS NOT NULL);
    """,
    # 16: on PostgreSQL a policy's content lives in the database, a row per chunk (``farmd.store.policy_chunks``),
    # so every coordinator sharing the database serves every version; a row's ``file`` names it as it would name a
    # file. SQLite keeps content in files beside the database and leaves this table empty.
    """
    CREATE TABLE policy_chunks (
        sha256 TEXT NOT NULL,
        n INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (sha256, n)
    );
    """,
    # 17: a run's jobs found by their groups (a run's progress counts them by state; a trainer polls it), not by
    # reading every job the farm ever queued. ``group_id`` never changes, so a job's leases and completion leave the
    # index alone: it costs an entry when a job is queued.
    """
    CREATE INDEX jobs_by_group ON jobs(group_id);
    """,
)
