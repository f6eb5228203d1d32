pytest_plugins = ["conformance.plugin"]
