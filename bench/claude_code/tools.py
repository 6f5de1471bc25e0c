"""The 24 tool definitions, hand-written: name -> (description core, relative size weight,
input schema). text.tool_definitions pads each description to its share of a byte budget."""

from __future__ import annotations

from typing import Any

SCHEMA_URI = "http://json-schema.org/draft-07/schema#"


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        "$schema": SCHEMA_URI,
    }


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _n(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "number", "description": description, **extra}


def _b(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


TODO_ITEM = {
    "type": "object",
    "properties": {
        "content": {"type": "string", "minLength": 1},
        "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
        "activeForm": {"type": "string", "minLength": 1},
    },
    "required": ["content", "status", "activeForm"],
    "additionalProperties": False,
}

EDIT_ITEM = {
    "type": "object",
    "properties": {
        "old_string": _s("The text to replace"),
        "new_string": _s("The text to replace it with"),
        "replace_all": {
            "type": "boolean",
            "default": False,
            "description": "Replace all occurrences of old_string (default false).",
        },
    },
    "required": ["old_string", "new_string"],
    "additionalProperties": False,
}

QUESTION_ITEM = {
    "type": "object",
    "properties": {
        "question": _s("The complete question to ask the user, ending with a question mark."),
        "header": _s("A very short label shown as a chip next to the question (at most 12 characters)."),
        "options": {
            "type": "array",
            "minItems": 2,
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "label": _s("The text of the choice, one to five words."),
                    "description": _s("What choosing this option means or implies."),
                },
                "required": ["label", "description"],
                "additionalProperties": False,
            },
            "description": "The available choices; an 'Other' choice with free text is always added.",
        },
        "multiSelect": _b("Allow more than one option to be selected."),
    },
    "required": ["question", "header", "options", "multiSelect"],
    "additionalProperties": False,
}

TOOLS: list[tuple[str, str, float, dict[str, Any]]] = [
    (
        "Agent",
        "Start a delegated agent that works on its own on a complex, multi-step task and reports back.\n\n"
        "Each agent type has its own instructions and a subset of the tools. Available agent types:\n"
        "- general-purpose: researching open questions, searching code and carrying out multi-step tasks (all tools)\n"
        "- explorer: fast read-only exploration of a codebase; give it a thoroughness of quick, medium or very thorough (Glob, Grep, Read, Bash)\n"
        "- planner: designs an implementation plan before any code is written (Read, Grep, Glob, WebFetch)\n"
        "- reviewer: reviews a finished change for bugs, missing tests and unclear naming (Read, Grep, Glob, Bash)\n"
        "- statusline-setup: configures the status line of the terminal (Read, Edit)\n\n"
        "When not to use it: to read one known file, to find a class by name, or to search two or three files; "
        "the direct tools are faster for that.",
        7.5,
        _obj(
            {
                "description": _s("A short (3-5 word) description of the task"),
                "prompt": _s("The task for the agent to perform"),
                "subagent_type": _s("The type of specialized agent to use for this task"),
                "model": _s(
                    "Optional model to run the agent with; defaults to the current one.",
                    enum=["sonnet", "opus", "haiku"],
                ),
            },
            ["description", "prompt", "subagent_type"],
        ),
    ),
    (
        "Bash",
        "Runs a bash command in a persistent shell session with an optional timeout.\n\n"
        "Use it for terminal operations: git, package managers, test runners, build tools, docker. Do not use it "
        "for file operations that have a dedicated tool (reading, writing, editing, searching, listing).\n\n"
        "Before running a command that creates files or directories, check with the listing tool that the "
        "parent directory exists and is the intended location. Always quote paths that contain spaces. Give a "
        "short description of what the command does in five to ten words. Commands time out after 120000 ms "
        "unless a timeout of up to 600000 ms is given; output above 30000 characters is truncated. Set "
        "run_in_background to start a long-running process (a dev server, a watcher) and read its output later.\n\n"
        "# Committing changes with git\n\n"
        "Only commit when the user asks. Then: 1. run git status, git diff and git log in parallel to see what "
        "changed and how commit messages are written here; 2. draft a message that focuses on why, not what; "
        "3. add the relevant files, commit, and run git status to confirm. Never update the git configuration, "
        "never push unless asked, never use interactive flags such as -i.\n\n"
        "# Creating pull requests\n\n"
        "Use the gh command for everything GitHub related. Look at every commit since the branch diverged from "
        "the base branch, draft a summary of a few bullet points and a test plan, push with -u if the branch has "
        "no upstream, and create the pull request with a heredoc body. Return the pull request URL when done.",
        11.0,
        _obj(
            {
                "command": _s("The command to execute"),
                "timeout": _n("Optional timeout in milliseconds (max 600000)"),
                "description": _s(
                    "Clear, concise description of what this command does in 5-10 words, in active voice."
                ),
                "run_in_background": _b(
                    "Set to true to run this command in the background. Read its output later with BashOutput."
                ),
                "dangerouslyDisableSandbox": _b("Run the command outside the sandbox (asks the user for approval)."),
            },
            ["command"],
        ),
    ),
    (
        "BashOutput",
        "Reads the new output of a background shell since the last read, with its status (running, completed, "
        "failed). Optionally keeps only the lines that match a regular expression.",
        0.6,
        _obj(
            {
                "bash_id": _s("The id of the background shell to read output from"),
                "filter": _s(
                    "Optional regular expression; only matching lines are returned. Non-matching lines are discarded."
                ),
            },
            ["bash_id"],
        ),
    ),
    (
        "KillShell",
        "Stops a background shell by its id and reports whether it was running.",
        0.35,
        _obj({"shell_id": _s("The id of the background shell to kill")}, ["shell_id"]),
    ),
    (
        "Glob",
        "Fast file pattern matching that works with any codebase size. Returns matching file paths sorted by "
        "modification time. Use it to find files by name patterns such as **/*.py or src/**/test_*.ts. For an "
        "open-ended search that may need several rounds of globbing and grepping, use the Agent tool instead.",
        0.9,
        _obj(
            {
                "pattern": _s("The glob pattern to match files against"),
                "path": _s(
                    "The directory to search in. Omit it to use the current working directory; do not pass null or 'undefined'."
                ),
            },
            ["pattern"],
        ),
    ),
    (
        "Grep",
        "A powerful search tool built on ripgrep. Always use it for searching file contents; never run grep or "
        "rg through the shell. Supports full regular expressions, file filtering by glob or type, and three "
        "output modes: content (matching lines), files_with_matches (paths only, the default) and count. "
        "Patterns match within single lines unless multiline is set.",
        2.0,
        _obj(
            {
                "pattern": _s("The regular expression pattern to search for in file contents"),
                "path": _s("File or directory to search in. Defaults to the current working directory."),
                "glob": _s('Glob pattern to filter files (e.g. "*.js", "*.{ts,tsx}")'),
                "output_mode": _s(
                    "Output mode; defaults to files_with_matches.", enum=["content", "files_with_matches", "count"]
                ),
                "-B": _n("Number of lines to show before each match (content mode only)."),
                "-A": _n("Number of lines to show after each match (content mode only)."),
                "-C": _n("Number of lines to show before and after each match (content mode only)."),
                "-n": _b("Show line numbers in the output (content mode only)."),
                "-i": _b("Case insensitive search"),
                "type": _s("File type to search (rg --type), e.g. js, py, rust, go, java."),
                "head_limit": _n("Limit the output to the first N lines or entries."),
                "multiline": _b(
                    "Enable multiline mode where . matches newlines and patterns can span lines. Default: false."
                ),
            },
            ["pattern"],
        ),
    ),
    (
        "LS",
        "Lists the files and directories at an absolute path, optionally ignoring glob patterns. Prefer Glob "
        "and Grep when you know what you are looking for.",
        0.55,
        _obj(
            {
                "path": _s("The absolute path to the directory to list (must be absolute, not relative)"),
                "ignore": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "List of glob patterns to ignore",
                },
            },
            ["path"],
        ),
    ),
    (
        "Read",
        "Reads a file from the local filesystem. The file_path parameter must be an absolute path. By default "
        "it reads up to 2000 lines from the start of the file; give an offset and a limit for long files. Lines "
        "longer than 2000 characters are cut. Results use cat -n format, with line numbers starting at 1. "
        "Images are shown to you, PDFs page by page, Jupyter notebooks with all their cells and outputs. It can "
        "only read files, not directories. Reading several files that may be useful in one response is better "
        "than reading them one at a time. A file that exists but is empty is reported with a warning.",
        2.3,
        _obj(
            {
                "file_path": _s("The absolute path to the file to read"),
                "offset": _n(
                    "The line number to start reading from. Only provide if the file is too large to read at once"
                ),
                "limit": _n("The number of lines to read. Only provide if the file is too large to read at once."),
            },
            ["file_path"],
        ),
    ),
    (
        "Edit",
        "Performs an exact string replacement in a file. Read the file at least once in the conversation before "
        "editing it. Preserve the exact indentation as it appears after the line-number prefix of the Read "
        "output; never include the prefix itself in old_string or new_string. The edit fails if old_string is "
        "not unique in the file; give more context or use replace_all to change every occurrence, which is "
        "useful for renaming a variable.",
        1.7,
        _obj(
            {
                "file_path": _s("The absolute path to the file to modify"),
                "old_string": _s("The text to replace"),
                "new_string": _s("The text to replace it with (must be different from old_string)"),
                "replace_all": {
                    "type": "boolean",
                    "default": False,
                    "description": "Replace all occurrences of old_string (default false)",
                },
            },
            ["file_path", "old_string", "new_string"],
        ),
    ),
    (
        "MultiEdit",
        "Makes several edits to one file in a single operation. The edits are applied in order, each to the "
        "result of the previous one, and either all of them succeed or none is applied. Use it instead of "
        "several Edit calls when changing several places in the same file. Plan the edits so that an earlier "
        "one does not change the text a later one looks for.",
        2.6,
        _obj(
            {
                "file_path": _s("The absolute path to the file to modify"),
                "edits": {
                    "type": "array",
                    "items": EDIT_ITEM,
                    "minItems": 1,
                    "description": "Array of edit operations to perform sequentially on the file",
                },
            },
            ["file_path", "edits"],
        ),
    ),
    (
        "Write",
        "Writes a file to the local filesystem, replacing it if it exists. An existing file must have been read "
        "first. Prefer editing existing files; never write documentation files unless asked to.",
        1.0,
        _obj(
            {
                "file_path": _s("The absolute path to the file to write (must be absolute, not relative)"),
                "content": _s("The content to write to the file"),
            },
            ["file_path", "content"],
        ),
    ),
    (
        "NotebookEdit",
        "Replaces, inserts or deletes one cell of a Jupyter notebook (.ipynb), addressed by its cell id.",
        0.8,
        _obj(
            {
                "notebook_path": _s("The absolute path to the Jupyter notebook file to edit"),
                "cell_id": _s("The id of the cell to edit; for insertion, the new cell goes after it."),
                "new_source": _s("The new source for the cell"),
                "cell_type": _s("The type of the cell (code or markdown).", enum=["code", "markdown"]),
                "edit_mode": _s(
                    "The type of edit to make (replace, insert, delete). Defaults to replace.",
                    enum=["replace", "insert", "delete"],
                ),
            },
            ["notebook_path", "new_source"],
        ),
    ),
    (
        "WebFetch",
        "Fetches a URL, converts the page to Markdown and answers a prompt about it with a small, fast model. "
        "HTTP addresses are upgraded to HTTPS. Results are cached for fifteen minutes. When a redirect leads to "
        "another host, the new address is returned and must be fetched with a new call. Prefer an MCP-provided "
        "fetch tool when one is available; it may have fewer restrictions.",
        1.8,
        _obj(
            {
                "url": _s("The URL to fetch content from", format="uri"),
                "prompt": _s("The prompt to run on the fetched content"),
            },
            ["url", "prompt"],
        ),
    ),
    (
        "WebSearch",
        "Searches the web and returns result blocks with titles and URLs, to answer questions about recent "
        "events or documentation newer than your knowledge. Domains can be allowed or blocked. After answering "
        "from search results, list the sources you used as Markdown links.",
        1.3,
        _obj(
            {
                "query": _s("The search query to use", minLength=2),
                "allowed_domains": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Only include search results from these domains",
                },
                "blocked_domains": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Never include search results from these domains",
                },
            },
            ["query"],
        ),
    ),
    (
        "TodoWrite",
        "Creates and maintains a structured task list for the current session. It helps you keep track of "
        "progress on complex work and shows the user what you are doing.\n\n"
        "## When to use it\n"
        "1. A task needs three or more distinct steps.\n"
        "2. The user asks for a todo list or gives several tasks at once.\n"
        "3. New instructions arrive in the middle of the work: capture them as tasks.\n"
        "4. You start working on a task: mark it in_progress before beginning.\n"
        "5. You finish a task: mark it completed and add any follow-up tasks you discovered.\n\n"
        "## When not to use it\n"
        "A single straightforward task, a purely informational question, or a change that takes fewer than "
        "three trivial steps. Then just do the work.\n\n"
        "## Task states\n"
        "pending (not started), in_progress (being worked on; exactly one at a time), completed (finished "
        'successfully). Each task has two forms: content, the imperative ("Run the tests"), and activeForm, '
        'the present continuous shown while it runs ("Running the tests"). Only mark a task completed when it '
        "is fully done: tests pass, the implementation is complete, nothing is left unresolved.",
        9.0,
        _obj({"todos": {"type": "array", "items": TODO_ITEM, "description": "The updated todo list"}}, ["todos"]),
    ),
    (
        "ExitPlanMode",
        "Use it in plan mode when you have finished planning an implementation and are ready to code: it shows "
        "the plan to the user for approval. Only for tasks that need writing code, not for research, reading "
        "or answering questions. Resolve open questions with the user before calling it.",
        1.5,
        _obj(
            {
                "plan": _s(
                    "The plan you came up with, that you want to run by the user for approval. Supports markdown. The plan should be pretty concise."
                )
            },
            ["plan"],
        ),
    ),
    (
        "EnterPlanMode",
        "Switches to plan mode for a task that deserves a design before any change: several files, unclear "
        "requirements, or an architectural decision. In plan mode only read-only tools are available.",
        1.0,
        _obj({"reason": _s("Why planning first is worthwhile for this task.")}, []),
    ),
    (
        "Skill",
        "Runs a skill in the main conversation. Skills are folders of instructions, scripts and resources that "
        "extend what you can do for specialized tasks (documents, spreadsheets, deployment procedures). The "
        "skill's instructions are loaded into the conversation when it starts; follow them. Invoke only skills "
        "listed as available, and do not invoke a skill that is already running.",
        1.6,
        _obj({"skill": _s('The skill name (no arguments). E.g., "pdf" or "release-notes"')}, ["skill"]),
    ),
    (
        "SlashCommand",
        "Runs a custom slash command defined by the project or the user, such as /review-pr 123. The command's "
        "prompt is expanded in the conversation and you continue with it. Only commands listed as available "
        "can be run; built-in commands like /help or /clear cannot.",
        1.6,
        _obj({"command": _s('The slash command to execute with its arguments, e.g., "/review-pr 123"')}, ["command"]),
    ),
    (
        "AskUserQuestion",
        "Asks the user one to four multiple-choice questions while you work: to clarify ambiguous instructions, "
        "to learn preferences, or to choose between implementation options. Users can always answer with free "
        "text instead of an option. Use multiSelect when the choices are not mutually exclusive.",
        2.0,
        _obj(
            {
                "questions": {
                    "type": "array",
                    "items": QUESTION_ITEM,
                    "minItems": 1,
                    "maxItems": 4,
                    "description": "Questions to ask the user (1-4 questions)",
                },
                "answers": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "User answers collected by the permission component",
                },
            },
            ["questions"],
        ),
    ),
    (
        "ListMcpResourcesTool",
        "Lists the resources offered by the configured MCP servers, optionally of one server only.",
        0.45,
        _obj({"server": _s("Optional server name to filter resources by")}, []),
    ),
    (
        "ReadMcpResourceTool",
        "Reads one resource of an MCP server by its URI.",
        0.35,
        _obj({"server": _s("The MCP server name"), "uri": _s("The resource URI to read")}, ["server", "uri"]),
    ),
    (
        "mcp__ide__getDiagnostics",
        "Gets the language diagnostics (errors, warnings) the editor reports, for one file or all open files.",
        0.35,
        _obj(
            {"uri": _s("Optional file URI to get diagnostics for. If not provided, gets diagnostics for all files.")},
            [],
        ),
    ),
    (
        "mcp__ide__executeCode",
        "Executes Python code in the kernel of the notebook that is open in the editor. State persists across "
        "calls until the kernel restarts. Avoid changing the kernel's state unless the user asked for it.",
        1.0,
        _obj({"code": _s("The code to be executed on the kernel.")}, ["code"]),
    ),
]

SMALL_TOOL_NAMES = ("Bash", "Read", "Edit", "Grep")
