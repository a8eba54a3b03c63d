"""The loop job and its parts: ``job`` runs one loop (lease, worktree, turns, pull
request, hand-over), built from ``runner``'s ``RunnerBase`` and the parts that extend it
(``base_verify``, ``section_audits``, ``post_action``, ``pull_request``, ``handover``,
``news``), with the metric loop (``metric``), the setup phase, the lease, check runs and
verify evidence."""
