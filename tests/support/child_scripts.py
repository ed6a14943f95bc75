"""What a script the tests run in a child Python process starts with.

Ctrl-C there must be Python's KeyboardInterrupt, as in a terminal: under the full suite the test process was
seen to start its children with SIGINT (and SIGQUIT) ignored, as system(3) leaves them while it runs a command,
and a child that ignores Ctrl-C cannot show what Ctrl-C does to an engine.
"""

CTRL_C_AS_IN_A_TERMINAL = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
