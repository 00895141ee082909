pytest_plugins = ["roll.core.testing"]
