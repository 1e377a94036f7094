package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
)

// The stub's attachment methods: uploads are drained and counted, the one
// downloadable attachment is downloadID.
const downloadID = "0123456789abcdef0123456789abcdef"

func (s *stub) UploadAttachments(_ context.Context, next func() (string, io.Reader, error)) ([]service.Attachment, error) {
	var out []service.Attachment
	for {
		name, r, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		n, err := io.Copy(io.Discard, r)
		if err != nil {
			return nil, err
		}
		out = append(out, service.Attachment{ID: fmt.Sprintf("%032x", len(out)+1), Name: name, Size: n})
	}
	if len(out) == 0 {
		return nil, errdefs.Field("files", "no file")
	}
	return out, nil
}

type readSeekCloser struct{ *strings.Reader }

func (readSeekCloser) Close() error { return nil }

func (s *stub) OpenAttachment(_ context.Context, id string) (service.Attachment, io.ReadCloser, error) {
	if id != downloadID {
		return service.Attachment{}, nil, fmt.Errorf("attachment %s: %w", id, errdefs.ErrNotFound)
	}
	m := service.Attachment{ID: id, Name: "relevé de compte.csv", Type: "text/csv; charset=utf-8", Size: 11, SHA256: "abc", CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	return m, readSeekCloser{strings.NewReader("date,amount")}, nil
}

func (s *stub) CreateAttachmentFromWorkspace(context.Context, service.CreateAttachmentRequest) (service.Attachment, error) {
	return service.Attachment{}, errUnset
}

func (s *stub) GC(_ context.Context, req service.GCRequest) (service.GCReport, error) {
	return service.GCReport{DryRun: req.DryRun}, nil
}

// files returns a next function over name/content pairs.
func files(pairs ...string) func() (string, io.Reader, error) {
	return func() (string, io.Reader, error) {
		if len(pairs) == 0 {
			return "", nil, io.EOF
		}
		name, content := pairs[0], pairs[1]
		pairs = pairs[2:]
		return name, strings.NewReader(content), nil
	}
}

func MustServeUploads(t *testing.T, max int64) (*Client, string) {
	t.Helper()
	hs := httptest.NewServer(newTestServer(&stub{}, Options{MaxUploadRequestBytes: max, MaxUploadFiles: 3}, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	return NewClient(hs.URL, ""), hs.URL
}

func TestUploadStreamsEveryFile(t *testing.T) {
	cl, _ := MustServeUploads(t, 1<<20)
	atts, err := cl.UploadAttachments(context.Background(), files("a.csv", "1,2\n", "b.png", strings.Repeat("x", 300<<10)))
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 2 || atts[0].Name != "a.csv" || atts[0].Size != 4 || atts[1].Name != "b.png" || atts[1].Size != 300<<10 {
		t.Errorf("attachments %+v, want a.csv of 4 bytes and b.png of 300 KiB", atts)
	}
}

func TestUploadOverTheRequestLimitIs413(t *testing.T) {
	cl, _ := MustServeUploads(t, 64<<10)
	_, err := cl.UploadAttachments(context.Background(), files("big.bin", strings.Repeat("x", 1<<20)))
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "limits.max_upload_request_bytes") {
		t.Errorf("err %v, want a 413 naming the limit", err)
	}
}

func TestUploadBadRequests(t *testing.T) {
	cl, url := MustServeUploads(t, 1<<20)
	resp, err := http.Post(url+"/api/attachments", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("JSON body: %d, want 400", resp.StatusCode)
	}
	if _, err := cl.UploadAttachments(context.Background(), files()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("no files: %v, want 400", err)
	}
	_, err = cl.UploadAttachments(context.Background(), files("1", "a", "2", "b", "3", "c", "4", "d"))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "more than 3 files") {
		t.Errorf("four files with a limit of three: %v", err)
	}
}

func TestDownloadKeepsTheName(t *testing.T) {
	cl, url := MustServeUploads(t, 1<<20)
	m, rc, err := cl.OpenAttachment(context.Background(), downloadID)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var b bytes.Buffer
	io.Copy(&b, rc)
	if m.Name != "relevé de compte.csv" || m.SHA256 != "abc" || m.Size != 11 || b.String() != "date,amount" || m.Type != "text/csv; charset=utf-8" {
		t.Errorf("got %+v %q", m, b.String())
	}
	resp, err := http.Get(url + "/api/attachments/" + downloadID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if cd := resp.Header.Get("Content-Disposition"); !strings.HasPrefix(cd, "attachment;") || !strings.Contains(cd, "filename*=utf-8''relev%C3%A9") {
		t.Errorf("Content-Disposition %q", cd)
	}
	if _, _, err := cl.OpenAttachment(context.Background(), strings.Repeat("f", 32)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown id: %v, want 404", err)
	}
}
