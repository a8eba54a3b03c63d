"""What happens to an issue before its first turn: readiness triage (``triage``), the plan
of sections (``plan``), both made of one structured model call (``structured``)."""
