"""Ray executor: one actor per rank (filled in by the Ray executor issue)."""
