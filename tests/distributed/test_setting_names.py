"""Each setting of a distributed job has one name, whichever entry point takes it."""

import inspect

from ifrtpy import distributed


def test_initialize_distributed_takes_the_settings_by_the_names_initialize_gives_them():
    general = inspect.signature(distributed.initialize).parameters
    for_jax = inspect.signature(distributed.initialize_distributed).parameters
    assert set(for_jax) <= set(general), set(for_jax) - set(general)
    timeouts = {name for name in for_jax if "timeout" in name}
    assert timeouts == {"initialization_timeout", "heartbeat_timeout", "shutdown_timeout",
                        "collective_timeout"}
