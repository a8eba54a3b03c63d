"""Rules of the loop itself: its turns, sections, stops, budgets, context and what the
agent is given. Pure."""
