"""What a compaction asks of the model: the request, after the conversation, for a summary to go on from.
Shared by the server's compactions (engine/api/response_compaction.py, anthropic_compaction.py) and
`ninfer chat`'s /compact."""

INSTRUCTION = (
    "Your context is nearly full, so this conversation is being compacted. Write a summary that lets you "
    "go on with the task from it alone: the user's goals and requirements, what has been done and found "
    "(files, commands, results, decisions and why), what is left to do and the next step, and anything "
    "else that must not be lost. Write only the summary."
)
