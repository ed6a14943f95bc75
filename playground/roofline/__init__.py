"""The Roofline tab: prefill and decode steps placed against this device's measured limits."""
