"""Network policy: the Kubernetes model, its evaluator, workload endpoints and enforcement."""
