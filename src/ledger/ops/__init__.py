"""Operations tooling for drills and tests: the drill runner, clusters, the fault proxy and fault points, Patroni, the git server harness, network namespaces."""
