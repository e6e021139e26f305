"""`make bench`: every benchmark, each comparing an alternative side by side in one run."""
from __future__ import annotations

from bench import bench_learner, bench_pipeline, bench_reward_service, bench_rollout, bench_sandbox, bench_weight_sync

if __name__ == "__main__":
    bench_sandbox.main()
    bench_rollout.main()
    bench_weight_sync.main()
    bench_learner.main()
    bench_reward_service.main()
    bench_pipeline.main()
