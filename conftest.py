pytest_plugins = ["conformance.frontend.plugin"]
