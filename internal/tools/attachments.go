package tools

import (
	"context"
	"encoding/json"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/strictjson"
)

// AttachmentResult is create_attachment_from_workspace's answer: the
// attachment and where to download it.
type AttachmentResult struct {
	service.Attachment
	DownloadPath string `json:"download_path"`
}

func createAttachmentFromWorkspace(lib service.Library) Tool {
	return Tool{
		Name: "create_attachment_from_workspace",
		Description: `Create an attachment from a workspace file so it can be sent in messages.
Use this to send worker output files (images, documents, etc.) to the user.

Returns an attachment_id that can be used with send_message or included in responses; the file downloads from GET /api/attachments/{attachment_id}.`,
		Schema: json.RawMessage(`{"type":"object","properties":{
"source_path":{"type":"string","description":"Path to file in workspace (shared/ or tasks/task-id/output/), e.g. 'tasks/task-01j.../output/chart.png' or 'shared/scripts/resize_images.py'. A path without either prefix is relative to shared/."},
"description":{"type":"string","description":"Description of the attachment for accessibility."}},
"required":["source_path"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var req service.CreateAttachmentRequest
			if err := strictjson.Decode(args, &req); err != nil {
				return nil, err
			}
			m, err := lib.CreateAttachmentFromWorkspace(ctx, req)
			if err != nil {
				return nil, err
			}
			return AttachmentResult{Attachment: m, DownloadPath: "/api/attachments/" + m.ID}, nil
		},
	}
}
