"""Engine targets other than vLLM: each turns a PlanRequest into that engine's own plan."""
