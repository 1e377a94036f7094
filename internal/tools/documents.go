package tools

import (
	"context"
	"encoding/json"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/strictjson"
)

func ingestFromWorkspace(lib service.Library) Tool {
	return Tool{
		Name: "ingest_from_workspace",
		Description: `Ingest a file from the workspace into the document index.
This makes the file searchable and available to later tasks (spawn_worker's document_ids).

Use this for worker outputs that should become part of the knowledge base. Plain text,
Markdown, CSV and JSON are indexed by their text; other files (PDFs, images) are stored and
found by their title and metadata only, and the answer says so.`,
		Schema: json.RawMessage(`{"type":"object","properties":{
"source_path":{"type":"string","description":"Path to file in workspace. Can be in shared/ or tasks/task-id/output/."},
"title":{"type":"string","description":"Title for the document in the index."},
"source_type":{"type":"string","enum":["worker_output","generated","imported","note"],"default":"worker_output","description":"Type of document for categorization; note makes it a note (found by note_query)."},
"document_type":{"type":"string","enum":["note"],"description":"'note' is the same as source_type note."},
"metadata":{"type":"object","description":"Optional metadata to attach (tags, source_task_id, etc.)."}},
"required":["source_path","title"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var req service.IngestRequest
			if err := strictjson.Decode(args, &req); err != nil {
				return nil, err
			}
			if req.Content != nil {
				return nil, errdefs.Field("content", "is not an argument of ingest_from_workspace; push a note with POST /api/documents")
			}
			return lib.IngestDocument(ctx, req)
		},
	}
}

func exportNotesToWorkspace(lib service.Library) Tool {
	return Tool{
		Name: "export_notes_to_workspace",
		Description: `Export notes matching a search query to the workspace as markdown files.
Use this to give workers access to relevant notes for synthesis, analysis, or reference.

Each note is exported as a separate .md file with frontmatter containing metadata.`,
		Schema: json.RawMessage(`{"type":"object","properties":{
"query":{"type":"string","description":"Search query to find relevant notes (ranked full-text search)."},
"destination_dir":{"type":"string","description":"Directory in /workspace/shared/ to export to. Example: 'context/project-notes/'"},
"max_notes":{"type":"integer","default":20,"minimum":1,"maximum":100,"description":"Maximum number of notes to export."}},
"required":["query","destination_dir"],"additionalProperties":false}`),
		Call: decoded(lib, service.Library.ExportNotes),
	}
}

func searchDocuments(lib service.Library) Tool {
	return Tool{
		Name:        "search_documents",
		Description: "Search the document index (ingested files and notes), best match first. Every word of the query counts; documents with more of them rank higher. Returns document IDs for spawn_worker's document_ids.",
		Schema: json.RawMessage(`{"type":"object","properties":{
"q":{"type":"string","description":"Words to search for."},
"type":{"type":"string","enum":["note","document"],"description":"Only notes, or only other documents; both when left out."},
"limit":{"type":"integer","default":20,"minimum":1,"maximum":100,"description":"At most this many results."}},
"required":["q"],"additionalProperties":false}`),
		Call: decoded(lib, service.Library.SearchDocuments),
	}
}
