package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/tools"
)

// UploadResponse is POST /api/attachments's answer: the first (usually
// only) attachment's fields, and every attachment of the request.
type UploadResponse struct {
	service.Attachment
	DownloadPath string               `json:"download_path"`
	Attachments  []service.Attachment `json:"attachments"`
}

// defaultMaxUploadFiles bounds the files of one upload request.
const defaultMaxUploadFiles = 100

// uploadAttachments streams a multipart/form-data body: each part with a
// file name becomes an attachment, written to disk as it arrives, never
// held in memory. Other parts are ignored. All or none are kept.
func (s *Server) uploadAttachments(w http.ResponseWriter, r *http.Request) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		return errdefs.Field("Content-Type", "must be multipart/form-data with one or more file parts")
	}
	max := s.opts.MaxUploadRequestBytes
	if max > 0 {
		if r.ContentLength > max {
			return fmt.Errorf("the request is %d bytes, over the upload request limit of %s (limits.max_upload_request_bytes): %w", r.ContentLength, formatSize(max), errdefs.ErrTooLarge)
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
	}
	mr, err := r.MultipartReader()
	if err != nil {
		return fmt.Errorf("read multipart body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	maxFiles := s.opts.MaxUploadFiles
	if maxFiles <= 0 {
		maxFiles = defaultMaxUploadFiles
	}
	files := 0
	var part *multipart.Part
	next := func() (string, io.Reader, error) {
		for {
			if part != nil {
				part.Close()
			}
			p, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				return "", nil, io.EOF
			}
			if err != nil {
				return "", nil, s.uploadError(err)
			}
			part = p
			if p.FileName() == "" {
				continue
			}
			if files++; files > maxFiles {
				return "", nil, errdefs.Field("files", fmt.Sprintf("more than %d files in one request", maxFiles))
			}
			return p.FileName(), uploadReader{s, p}, nil
		}
	}
	atts, err := s.svc.Library.UploadAttachments(r.Context(), next)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/attachments/"+atts[0].ID)
	writeJSON(w, http.StatusCreated, UploadResponse{Attachment: atts[0], DownloadPath: "/api/attachments/" + atts[0].ID, Attachments: atts})
	return nil
}

// uploadReader turns the request limit's error into a classified one.
type uploadReader struct {
	s *Server
	r io.Reader
}

func (u uploadReader) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = u.s.uploadError(err)
	}
	return n, err
}

func (s *Server) uploadError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return fmt.Errorf("the request is over the upload request limit of %s (limits.max_upload_request_bytes): %w", formatSize(mbe.Limit), errdefs.ErrTooLarge)
	}
	return fmt.Errorf("read multipart body: %v: %w", err, errdefs.ErrInvalidArgument)
}

func formatSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// downloadAttachment serves an attachment's content with its original
// name in Content-Disposition, its sha256 as the ETag, and ranges.
func (s *Server) downloadAttachment(w http.ResponseWriter, r *http.Request) error {
	m, rc, err := s.svc.Library.OpenAttachment(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", m.Type)
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": m.Name}))
	h.Set("ETag", `"sha256:`+m.SHA256+`"`)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox")
	if rs, ok := rc.(io.ReadSeeker); ok {
		http.ServeContent(w, r, "", m.CreatedAt, rs)
		return nil
	}
	h.Set("Content-Length", strconv.FormatInt(m.Size, 10))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, rc)
	return nil
}

// gc runs a retention sweep; ?dry_run=1 only reports.
func (s *Server) gc(w http.ResponseWriter, r *http.Request) error {
	rep, err := s.svc.Library.GC(r.Context(), service.GCRequest{DryRun: isTrue(r.URL.Query().Get("dry_run"))})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}

// UploadAttachments uploads files as one multipart request, streaming
// them through a pipe: nothing is held in memory.
func (c *Client) UploadAttachments(ctx context.Context, next func() (string, io.Reader, error)) ([]service.Attachment, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	done := make(chan error, 1)
	go func() {
		err := func() error {
			for {
				name, r, err := next()
				if errors.Is(err, io.EOF) {
					return mw.Close()
				}
				if err != nil {
					return err
				}
				part, err := mw.CreateFormFile("file", name)
				if err != nil {
					return err
				}
				if _, err := io.Copy(part, r); err != nil {
					return err
				}
			}
		}()
		pw.CloseWithError(err)
		done <- err
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/api/attachments", pr)
	if err != nil {
		pr.Close()
		<-done
		return nil, err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	pr.CloseWithError(errors.New("request ended")) // unblock the writer if the server answered early
	werr := <-done
	if err != nil {
		if werr != nil && !strings.Contains(werr.Error(), "request ended") {
			return nil, fmt.Errorf("upload: %w", werr)
		}
		return nil, c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		return nil, decodeError(resp)
	}
	var ur UploadResponse
	if err := json.NewDecoder(resp.Body).Decode(&ur); err != nil {
		return nil, fmt.Errorf("decode upload answer: %w", err)
	}
	return ur.Attachments, nil
}

// OpenAttachment downloads an attachment; the metadata comes from the
// response headers. The caller closes the content.
func (c *Client) OpenAttachment(ctx context.Context, id string) (service.Attachment, io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/api/attachments/"+url.PathEscape(id), nil, "")
	if err != nil {
		return service.Attachment{}, nil, err
	}
	m := service.Attachment{ID: id, Type: resp.Header.Get("Content-Type"), Size: resp.ContentLength}
	if _, params, err := mime.ParseMediaType(resp.Header.Get("Content-Disposition")); err == nil {
		m.Name = params["filename"]
	}
	m.SHA256 = strings.TrimSuffix(strings.TrimPrefix(resp.Header.Get("ETag"), `"sha256:`), `"`)
	if t, err := http.ParseTime(resp.Header.Get("Last-Modified")); err == nil {
		m.CreatedAt = t.UTC()
	} else {
		m.CreatedAt = time.Time{}
	}
	return m, resp.Body, nil
}

// CreateAttachmentFromWorkspace calls the create_attachment_from_workspace tool.
func (c *Client) CreateAttachmentFromWorkspace(ctx context.Context, req service.CreateAttachmentRequest) (service.Attachment, error) {
	var r tools.AttachmentResult
	err := c.call(ctx, http.MethodPost, "/api/tools/create_attachment_from_workspace", req, &r)
	return r.Attachment, err
}

// GC runs a retention sweep on the server.
func (c *Client) GC(ctx context.Context, req service.GCRequest) (service.GCReport, error) {
	p := "/api/gc"
	if req.DryRun {
		p += "?dry_run=1"
	}
	var rep service.GCReport
	err := c.call(ctx, http.MethodPost, p, nil, &rep)
	return rep, err
}
