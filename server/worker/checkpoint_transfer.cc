#include "server/worker/checkpoint_transfer.h"

#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace kiln::worker {
namespace {

// A checkpoint of a large model over a slow link still moves within this; a stalled one ends.
constexpr absl::Duration kTransferTimeout = absl::Minutes(30);
constexpr size_t kChunkBytes = size_t{1} << 20;

}  // namespace

absl::Status DownloadCheckpoint(CoordinatorConnection& connection, const std::string& job_id,
                                const v1::Checkpoint& checkpoint, const std::string& path) {
  const std::string what = absl::StrCat("reading checkpoint ", checkpoint.id(), " from kilnd");
  v1::ReadCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_checkpoint_id(checkpoint.id());
  auto context = connection.NewContext(kTransferTimeout);
  auto reader = connection.stub().ReadCheckpoint(context.get(), request);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> writer, AtomicFileWriter::Open(path));
  Sha256 digest;
  int64_t offset = 0;
  std::string sent_sha256;
  absl::Status error;
  v1::CheckpointChunk chunk;
  while (error.ok() && reader->Read(&chunk)) {
    if (chunk.offset() != offset) {
      error = absl::DataLossError(absl::StrCat(what, ": a chunk at offset ", chunk.offset(),
                                               " where ", offset, " was due"));
      break;
    }
    digest.Update(chunk.data());
    error = writer->Append(chunk.data());
    offset += static_cast<int64_t>(chunk.data().size());
    if (!chunk.sha256().empty()) sent_sha256 = chunk.sha256();
  }
  if (!error.ok()) {
    context->TryCancel();
    reader->Finish().IgnoreError();
    return error;
  }
  KILN_RETURN_IF_ERROR(FromGrpc(reader->Finish(), what));
  const std::string got = digest.HexDigest();
  const std::string& want = !checkpoint.sha256().empty() ? checkpoint.sha256() : sent_sha256;
  if (want.empty()) return absl::DataLossError(absl::StrCat(what, ": no sha256 came with it"));
  if (got != want || (!sent_sha256.empty() && sent_sha256 != want)) {
    return absl::DataLossError(absl::StrCat(what, ": its sha256 is ", got, ", not ", want));
  }
  return writer->Commit();
}

absl::StatusOr<v1::Checkpoint> UploadCheckpoint(CoordinatorConnection& connection,
                                                v1::WriteCheckpointHeader header,
                                                const std::string& path) {
  KILN_ASSIGN_OR_RETURN(const std::string sha256, Sha256OfFile(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open checkpoint file ", path));
  in.seekg(0, std::ios::end);
  header.set_size_bytes(static_cast<int64_t>(in.tellg()));
  in.seekg(0);
  header.set_sha256(sha256);

  const std::string what =
      absl::StrCat("writing a checkpoint to kilnd (step ", header.global_step(), ")");
  auto context = connection.NewContext(kTransferTimeout);
  v1::Checkpoint record;
  auto writer = connection.stub().WriteCheckpoint(context.get(), &record);
  v1::WriteCheckpointRequest request;
  *request.mutable_header() = header;
  std::string buffer(kChunkBytes, '\0');
  bool first = true;
  while (first || in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize got = in.gcount();
    if (got <= 0 && !first) break;
    request.set_data(buffer.data(), static_cast<size_t>(std::max<std::streamsize>(got, 0)));
    if (!writer->Write(request)) break;  // kilnd ended the call: Finish says why
    request.clear_header();
    first = false;
  }
  if (in.bad()) {
    context->TryCancel();
    writer->Finish().IgnoreError();
    return absl::DataLossError(absl::StrCat("reading checkpoint file ", path, " failed"));
  }
  writer->WritesDone();
  KILN_RETURN_IF_ERROR(FromGrpc(writer->Finish(), what));
  return record;
}

}  // namespace kiln::worker
