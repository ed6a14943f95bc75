"""Entry point: `python app.py` opens the playground on the bundled demo model.

Honours GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (read by Gradio) and the PLAYGROUND_* limits
(see playground/settings.py).
"""

from playground.serve import create_playground, launch, warm_up

if __name__ == "__main__":
    app = create_playground()
    warm_up(app)
    launch(app)
