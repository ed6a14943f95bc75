"""Entry point: `python app.py` opens the playground on the bundled demo model.

Honours GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (read by Gradio) and the PLAYGROUND_* limits
(see playground/shared/settings.py).
"""

from playground.app import create_playground, launch, warm_up

if __name__ == "__main__":
    context = create_playground()
    warm_up(context)
    launch(context)
