"""An adversarial audit of the command line on the cpu backend (`python3 -m tools.audit.run`)."""
