// kiln datasets, datasets delete and upload: the datasets kilnd trains on (IDX, CIFAR-10, CSV,
// NPY, image folders, which are decoded here and sent as NPY, text corpora and llm.c token
// shards, which are streamed from disk rather than read whole).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli_status.h"
#include "client/command_env.h"
#include "client/format.h"
#include "client/image_decode.h"
#include "client/image_folder.h"
#include "client/npy_writer.h"
#include "client/table.h"
#include "common/byte_size.h"
#include "common/resource_name.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "kiln/v1/training.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace kiln::client {
namespace {

constexpr size_t kChunkBytes = 1 << 20;

// The CLI's name of a dataset format, as --format takes it.
std::string FormatName(v1::DatasetFormat format) {
  switch (format) {
    case v1::DATASET_FORMAT_UNSPECIFIED:
    case v1::DATASET_FORMAT_IDX:
      return "idx";
    case v1::DATASET_FORMAT_CIFAR10:
      return "cifar10";
    case v1::DATASET_FORMAT_CSV:
      return "csv";
    case v1::DATASET_FORMAT_NPY:
      return "npy";
    case v1::DATASET_FORMAT_TEXT:
      return "text";
    case v1::DATASET_FORMAT_TOKENS:
      return "tokens";
    default:
      return absl::StrCat("format ", static_cast<int>(format));
  }
}

absl::Status ListDatasets(CommandEnv& env) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::ListDatasetsResponse response;
  auto context = c->NewContext();
  grpc::Status status = stub->ListDatasets(context.get(), v1::ListDatasetsRequest(), &response);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    PrintJson(env, response);
    return absl::OkStatus();
  }
  if (response.datasets().empty()) {
    std::fprintf(env.out,
                 "no datasets; add one with: kiln upload NAME --train-images F "
                 "--train-labels F\n");
    return absl::OkStatus();
  }
  // Token datasets count tokens in TRAIN and TEST (their validation split), and give their
  // vocabulary (text) or largest token id (llm.c shards, whose vocabulary is the model's).
  Table table({"NAME", "OWNER", "FORMAT", "TRAIN", "TEST", "SHAPE", "CLASSES/VOCAB", "SIZE"});
  for (const v1::Dataset& d : response.datasets()) {
    const bool tokens =
        d.format() == v1::DATASET_FORMAT_TEXT || d.format() == v1::DATASET_FORMAT_TOKENS;
    if (tokens) {
      table.AddRow({d.name(), OwnerText(d.owner()), FormatName(d.format()),
                    absl::StrCat(d.train_tokens(), " tokens"),
                    absl::StrCat(d.val_tokens(), " tokens"), "-",
                    d.vocab_size() > 0 ? absl::StrCat("vocab ", d.vocab_size())
                                       : absl::StrCat("ids 0-", d.max_token()),
                    FormatBytes(d.size_bytes())});
      continue;
    }
    table.AddRow({d.name(), OwnerText(d.owner()), FormatName(d.format()),
                  absl::StrCat(d.train_samples()), absl::StrCat(d.test_samples()),
                  absl::StrJoin(d.sample_shape(), "x"), absl::StrCat(d.num_classes()),
                  FormatBytes(d.size_bytes())});
  }
  table.Print(env.out);
  return absl::OkStatus();
}

absl::Status DeleteDataset(CommandEnv& env, const std::string& name) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::DeleteDatasetRequest request;
  request.set_name(name);
  v1::DeleteDatasetResponse response;
  auto context = c->NewContext();
  grpc::Status status = stub->DeleteDataset(context.get(), request, &response);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    v1::DeleteDatasetRequest deleted;
    deleted.set_name(name);
    PrintJson(env, deleted);
  } else {
    std::fprintf(env.out, "dataset %s deleted\n", name.c_str());
  }
  return absl::OkStatus();
}

struct UploadOptions {
  std::string name;
  std::string format = "idx";
  std::string train_images, train_labels, test_images, test_labels;
  // cifar10: the train batches, in order; csv: one table; folder: the folder of class folders.
  std::vector<std::string> train;
  // cifar10: the test batch; csv: the test table; folder: the test folder.
  std::string test;
  std::string label_column;         // csv: a header name or a 0-based index; empty: the last
  std::string header = "auto";      // csv: yes, no or auto
  double test_fraction = 0;         // csv: share of train rows held out without --test
  std::string resize;               // folder: HxW every image is resized to
  bool grayscale = false;           // folder: colour images become gray
  std::vector<std::string> corpus;  // text: the corpus's files, in order
  double val_fraction = 0;          // text: share held out for validation; 0: kilnd's 0.1
  std::vector<std::string> val;     // tokens: the validation shards
};

// A file to send: its name on the server, where it came from (for messages), and its bytes, or
// with `stream`, none: it is read from `source` chunk by chunk as it is sent.
struct UploadFile {
  std::string name;
  std::string source;
  std::string bytes;
  bool stream = false;
};

bool IsGzip(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// Whether any of --train-images, --train-labels, --test-images and --test-labels is given: the
// files of idx and npy, which the other formats refuse.
bool GivesIdxFiles(const UploadOptions& o) {
  return !o.train_images.empty() || !o.train_labels.empty() || !o.test_images.empty() ||
         !o.test_labels.empty();
}

// text: the corpus's files under their own names, in order; tokens: the shards as
// train_NNN.bin and val_NNN.bin, in the order given.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TokenUploadFiles(
    const UploadOptions& o) {
  std::vector<std::pair<std::string, std::string>> files;
  if (GivesIdxFiles(o) || !o.test.empty() || (o.format == "text" && !o.train.empty())) {
    return UsageError(o.format == "text"
                          ? "--format text takes the corpus as FILE... (in order) only"
                          : "--format tokens takes --train SHARD... and --val SHARD... only");
  }
  if (o.format == "text") {
    if (o.corpus.empty()) return UsageError("--format text needs one or more FILE (the corpus)");
    std::set<std::string> seen;
    for (const std::string& path : o.corpus) {
      const std::string name = std::filesystem::path(path).filename().string();
      if (!IsValidName(name)) {
        return UsageError(absl::StrCat(path, ": kilnd keeps the file's name, and \"", name,
                                       "\" is not one it takes (1-64 of A-Z a-z 0-9 . _ -, not "
                                       "starting with .): rename it"));
      }
      if (!seen.insert(name).second) {
        return UsageError(absl::StrCat(path, ": a second file named ", name));
      }
      files.push_back({name, path});
    }
    return files;
  }
  if (o.train.empty()) return UsageError("--format tokens needs --train SHARD...");
  for (size_t i = 0; i < o.train.size(); ++i) {
    files.push_back({absl::StrFormat("train_%03d.bin", i), o.train[i]});
  }
  for (size_t i = 0; i < o.val.size(); ++i) {
    files.push_back({absl::StrFormat("val_%03d.bin", i), o.val[i]});
  }
  return files;
}

// The files to send, as (server name, local path), after checking the options fit the format.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> UploadFiles(
    const UploadOptions& o) {
  std::vector<std::pair<std::string, std::string>> files;
  const bool csv_options = !o.label_column.empty() || o.header != "auto" || o.test_fraction != 0;
  if (csv_options && o.format != "csv") {
    return UsageError("--label-column, --header and --test-fraction are for --format csv");
  }
  if ((!o.resize.empty() || o.grayscale) && o.format != "folder") {
    return UsageError("--resize and --grayscale are for --format folder");
  }
  if ((!o.corpus.empty() || o.val_fraction != 0) && o.format != "text") {
    return UsageError("FILE... and --val-fraction are for --format text");
  }
  if (!o.val.empty() && o.format != "tokens") return UsageError("--val is for --format tokens");
  if (o.format == "text" || o.format == "tokens") return TokenUploadFiles(o);
  if (o.format == "folder") {
    if (GivesIdxFiles(o)) {
      return UsageError(
          "--format folder takes --train DIR and --test DIR, not --*-images or --*-labels");
    }
    if (o.train.size() != 1) return UsageError("--format folder needs one --train DIR");
    return files;  // none to read as they are: DecodeFolderFiles makes them
  }
  if (o.format == "cifar10") {
    if (GivesIdxFiles(o)) {
      return UsageError(
          "--format cifar10 takes --train FILE... and --test FILE, not --*-images "
          "or --*-labels");
    }
    if (o.train.empty()) return UsageError("--format cifar10 needs --train FILE...");
    // kilnd stores them under CIFAR-10's own names, the train split in the order given.
    for (size_t i = 0; i < o.train.size(); ++i) {
      files.push_back({absl::StrCat("data_batch_", i + 1, ".bin"), o.train[i]});
    }
    if (!o.test.empty()) files.push_back({"test_batch.bin", o.test});
    return files;
  }
  if (o.format == "csv") {
    if (GivesIdxFiles(o)) {
      return UsageError(
          "--format csv takes --train FILE and --test FILE, not --*-images or "
          "--*-labels");
    }
    if (o.train.size() != 1) return UsageError("--format csv needs one --train FILE");
    if (!o.test.empty() && o.test_fraction != 0) {
      return UsageError("--test and --test-fraction are alternatives");
    }
    files.push_back({"train.csv", o.train[0]});
    if (!o.test.empty()) files.push_back({"test.csv", o.test});
    return files;
  }
  if (o.format != "idx" && o.format != "npy") {
    return UsageError(absl::StrCat(
        "--format: \"", o.format, "\" is not one of idx, cifar10, csv, npy, folder, text, tokens"));
  }
  if (!o.train.empty() || !o.test.empty()) {
    return UsageError(
        "--train and --test are for --format cifar10, csv and folder; idx and npy take "
        "--train-images, --train-labels, --test-images and --test-labels");
  }
  if (o.train_images.empty() || o.train_labels.empty()) {
    return UsageError(
        absl::StrCat("--train-images and --train-labels are required for --format ", o.format));
  }
  if (o.test_images.empty() != o.test_labels.empty()) {
    return UsageError("--test-images and --test-labels go together");
  }
  // NPY sends the same four roles as arrays: samples (x) and labels (y) of each split.
  const bool npy = o.format == "npy";
  files = {{npy ? "train_x.npy" : "train-images-idx3-ubyte", o.train_images},
           {npy ? "train_y.npy" : "train-labels-idx1-ubyte", o.train_labels}};
  if (!o.test_images.empty()) {
    files.push_back({npy ? "test_x.npy" : "t10k-images-idx3-ubyte", o.test_images});
    files.push_back({npy ? "test_y.npy" : "t10k-labels-idx1-ubyte", o.test_labels});
  }
  return files;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return UsageError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The files as given, read; gzip IDX files (magic 1f 8b) keep a ".gz" on the server.
absl::StatusOr<std::vector<UploadFile>> ReadUploadFiles(
    const UploadOptions& o, const std::vector<std::pair<std::string, std::string>>& names) {
  std::vector<UploadFile> files;
  for (const auto& [name, path] : names) {
    if (o.format == "text" || o.format == "tokens") {
      // Shards and corpora can be large: sent as they are read, never held whole.
      if (!std::ifstream(path, std::ios::binary)) {
        return UsageError(absl::StrCat("cannot read ", path));
      }
      files.push_back({name, path, "", true});
      continue;
    }
    KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
    std::string server_name = name;
    if (IsGzip(bytes)) {
      if (o.format != "idx") {
        return UsageError(absl::StrCat(path, ": gzip-compressed; ", o.format,
                                       " files are sent uncompressed (gunzip it first)"));
      }
      server_name += ".gz";
    }
    files.push_back({std::move(server_name), path, std::move(bytes)});
  }
  return files;
}

// "HxW" as --resize takes it.
absl::Status ParseResize(const std::string& text, ImageFolderOptions* options) {
  const std::vector<std::string> parts = absl::StrSplit(text, 'x');
  int height = 0, width = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &height) ||
      !absl::SimpleAtoi(parts[1], &width) || height <= 0 || width <= 0) {
    return UsageError(
        absl::StrCat("--resize: \"", text, "\" is not HxW (height x width, e.g. 32x32)"));
  }
  KILN_RETURN_IF_ERROR(CheckImageSize("--resize", width, height));
  options->resize_height = height;
  options->resize_width = width;
  return absl::OkStatus();
}

// An image folder (and a test folder) decoded here into the four arrays of --format npy: uint8
// samples (N, H, W) or (N, 3, H, W), int32 labels (N,). `classes` gets the class names.
absl::StatusOr<std::vector<UploadFile>> DecodeFolderFiles(CommandEnv& env, const UploadOptions& o,
                                                          std::vector<std::string>* classes) {
  ImageFolderOptions options;
  options.grayscale = o.grayscale;
  if (!o.resize.empty()) KILN_RETURN_IF_ERROR(ParseResize(o.resize, &options));
  KILN_ASSIGN_OR_RETURN(ImageFolders folders, ReadImageFolders(o.train[0], o.test, options));
  *classes = folders.classes;
  std::vector<int64_t> shape = folders.sample_shape();
  std::vector<UploadFile> files;
  for (ImageSplit* split : {&folders.train, &folders.test}) {
    if (split == &folders.test && !folders.has_test) break;
    const std::string prefix = split == &folders.train ? "train" : "test";
    if (!env.json()) {
      std::fprintf(env.err, "%s: %lld images in %zu classes", split->dir.c_str(),
                   static_cast<long long>(split->count), folders.classes.size());
      if (split->ignored > 0) {
        std::fprintf(env.err, "; ignored %lld %s not %s images (e.g. %s)",
                     static_cast<long long>(split->ignored),
                     split->ignored == 1 ? "file that is" : "files that are", kImageExtensions,
                     split->ignored_example.c_str());
      }
      std::fprintf(env.err, "\n");
    }
    std::vector<int64_t> x_shape = {split->count};
    x_shape.insert(x_shape.end(), shape.begin(), shape.end());
    std::string x = NpyHeader("|u1", x_shape);
    x.append(split->samples);
    split->samples = std::string();  // one copy of the pixels at a time
    std::string y = NpyHeader("<i4", {split->count});
    for (int32_t label : split->labels) {
      // Little endian, as the header says.
      for (int b = 0; b < 4; ++b) y.push_back(static_cast<char>((label >> (8 * b)) & 0xff));
    }
    files.push_back({prefix + "_x.npy", split->dir, std::move(x)});
    files.push_back({prefix + "_y.npy", split->dir + " (labels)", std::move(y)});
  }
  return files;
}

using UploadWriter = grpc::ClientWriter<v1::UploadDatasetRequest>;

// Sends one file's chunks, the last carrying the sha256 of them all; false when the stream
// closed (Finish says why). A streamed file is read here, a chunk at a time.
absl::StatusOr<bool> SendFile(CommandEnv& env, UploadWriter* writer, const UploadFile& file) {
  std::ifstream in;
  int64_t size = static_cast<int64_t>(file.bytes.size());
  if (file.stream) {
    in.open(file.source, std::ios::binary | std::ios::ate);
    if (!in) return UsageError(absl::StrCat("cannot read ", file.source));
    size = static_cast<int64_t>(in.tellg());
    in.seekg(0);
  }
  if (!env.json()) {
    std::fprintf(env.err, "uploading %s as %s (%s)\n", file.source.c_str(), file.name.c_str(),
                 FormatBytes(size).c_str());
  }
  Sha256 sha;
  std::string piece;
  int64_t offset = 0;
  do {
    const auto n = static_cast<size_t>(std::min<int64_t>(kChunkBytes, size - offset));
    if (file.stream) {
      piece.resize(n);
      if (!in.read(piece.data(), static_cast<std::streamsize>(n))) {
        return UsageError(absl::StrCat(file.source, ": read error (or it shrank while sent)"));
      }
    } else {
      piece = file.bytes.substr(static_cast<size_t>(offset), n);
    }
    sha.Update(piece);
    offset += static_cast<int64_t>(n);
    v1::UploadDatasetRequest request;
    v1::DatasetFileChunk* chunk = request.mutable_chunk();
    chunk->set_file_name(file.name);
    chunk->set_data(piece);
    if (offset == size) chunk->set_sha256(sha.HexDigest());
    if (!writer->Write(request)) return false;
  } while (offset < size);
  return true;
}

v1::DatasetFormat UploadFormat(const std::string& format) {
  if (format == "cifar10") return v1::DATASET_FORMAT_CIFAR10;
  if (format == "csv") return v1::DATASET_FORMAT_CSV;
  if (format == "npy" || format == "folder") return v1::DATASET_FORMAT_NPY;
  if (format == "text") return v1::DATASET_FORMAT_TEXT;
  if (format == "tokens") return v1::DATASET_FORMAT_TOKENS;
  return v1::DATASET_FORMAT_IDX;
}

absl::Status Upload(CommandEnv& env, const UploadOptions& o) {
  KILN_ASSIGN_OR_RETURN(auto names, UploadFiles(o));
  const bool csv = o.format == "csv";
  const bool folder = o.format == "folder";
  const bool tokens = o.format == "text" || o.format == "tokens";
  std::vector<std::string> classes;
  KILN_ASSIGN_OR_RETURN(std::vector<UploadFile> files,
                        folder ? DecodeFolderFiles(env, o, &classes) : ReadUploadFiles(o, names));

  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  auto context = c->NewContext(absl::Minutes(30));
  v1::Dataset dataset;
  auto writer = stub->UploadDataset(context.get(), &dataset);
  v1::UploadDatasetRequest header;
  header.mutable_header()->set_name(o.name);
  header.mutable_header()->set_format(UploadFormat(o.format));
  header.mutable_header()->set_val_fraction(o.val_fraction);
  if (csv) {
    v1::CsvOptions* options = header.mutable_header()->mutable_csv();
    options->set_label_column(o.label_column);
    if (o.header != "auto") options->set_header(o.header == "yes");
    options->set_test_fraction(o.test_fraction);
  }
  // Declared up front, so that kilnd publishes the dataset only if all of them arrive.
  for (const UploadFile& file : files) header.mutable_header()->add_files(file.name);
  bool open = writer->Write(header);
  for (size_t f = 0; f < files.size() && open; ++f) {
    absl::StatusOr<bool> sent = SendFile(env, writer.get(), files[f]);
    if (!sent.ok()) {
      context->TryCancel();  // kilnd drops what it received; nothing is published
      writer->Finish();
      return sent.status();
    }
    open = *sent;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) return ServerError(status);
  // An image folder's class names are not part of the dataset kilnd keeps (the NPY format has
  // none), so they are reported here: label i is class i.
  if (env.json()) {
    nlohmann::json out = nlohmann::json::parse(MessageToJson(dataset, false));
    if (folder) out["class_names"] = classes;
    std::fprintf(env.out, "%s\n", out.dump(2).c_str());
  } else if (tokens) {
    std::fprintf(env.out, "dataset %s: %lld training and %lld validation tokens",
                 dataset.name().c_str(), static_cast<long long>(dataset.train_tokens()),
                 static_cast<long long>(dataset.val_tokens()));
    if (dataset.vocab_size() > 0) {
      std::fprintf(env.out, ", a vocabulary of %d characters\n", dataset.vocab_size());
    } else {
      std::fprintf(env.out, ", token ids up to %d\n", dataset.max_token());
    }
  } else {
    std::fprintf(env.out, "dataset %s: %lld training and %lld test samples of %s\n",
                 dataset.name().c_str(), static_cast<long long>(dataset.train_samples()),
                 static_cast<long long>(dataset.test_samples()),
                 absl::StrJoin(dataset.sample_shape(), "x").c_str());
    if (folder) {
      std::vector<std::string> numbered;
      for (size_t i = 0; i < classes.size(); ++i)
        numbered.push_back(absl::StrCat(i, " ", classes[i]));
      std::fprintf(env.out, "classes: %s\n", absl::StrJoin(numbered, ", ").c_str());
    }
  }
  return absl::OkStatus();
}

}  // namespace

void AddDatasetCommands(CLI::App& app, CommandEnv& env, Action* action) {
  CLI::App* l = app.add_subcommand("datasets", "List the datasets on the server");
  l->footer("Examples:\n  kiln datasets --output json\n  kiln datasets delete fashion");
  auto name = std::make_shared<std::string>();
  CLI::App* d = l->add_subcommand("delete", "Delete a dataset no queued or running job uses");
  d->add_option("name", *name, "Name of the dataset")->required();
  d->callback(
      [&env, action, name] { *action = [&env, name] { return DeleteDataset(env, *name); }; });
  l->callback([&env, action, l, d] {
    if (l->got_subcommand(d)) return;  // the delete's own callback set the action
    *action = [&env] { return ListDatasets(env); };
  });

  auto o = std::make_shared<UploadOptions>();
  CLI::App* u = app.add_subcommand("upload",
                                   "Upload a dataset: IDX files, CIFAR-10 batches, a CSV table, "
                                   "NumPy arrays, a folder of images, a text corpus or llm.c "
                                   "token shards");
  u->add_option("name", o->name, "Name of the new dataset")->required();
  u->add_option("files", o->corpus,
                "text: the corpus's UTF-8 files, concatenated in the order given (kilnd keeps "
                "the shards and vocabulary it builds from them, not the text)");
  u->add_option("--format", o->format, "idx (default), cifar10, csv, npy, folder, text or tokens")
      ->check(CLI::IsMember({"idx", "cifar10", "csv", "npy", "folder", "text", "tokens"}));
  u->add_option("--train-images", o->train_images, "idx: images (raw or .gz); npy: x array");
  u->add_option("--train-labels", o->train_labels, "idx: labels (raw or .gz); npy: y array");
  u->add_option("--test-images", o->test_images, "idx: test images; npy: test x array");
  u->add_option("--test-labels", o->test_labels, "idx: test labels; npy: test y array");
  u->add_option("--train", o->train,
                "cifar10: the train batches (data_batch_1.bin ...), in order; csv: the table; "
                "folder: a folder with one sub-folder of PNG or JPEG images per class; tokens: "
                "llm.c .bin shards, in order");
  u->add_option("--val", o->val, "tokens: the validation split's llm.c .bin shards");
  u->add_option("--val-fraction", o->val_fraction,
                "text: the share of the corpus (its end) kept for validation, in (0, 0.5]; "
                "default 0.1")
      ->check(CLI::Range(0.0, 0.5));
  u->add_option("--test", o->test,
                "cifar10: the test batch (test_batch.bin); csv: a test table; folder: a test "
                "folder with the same class sub-folders");
  u->add_option("--label-column", o->label_column,
                "csv: the label column, by header name or 0-based index (default: the last)");
  u->add_option("--header", o->header, "csv: whether the first row is a header: yes, no, auto")
      ->check(CLI::IsMember({"yes", "no", "auto"}));
  u->add_option("--test-fraction", o->test_fraction,
                "csv: without --test, hold out this share of the rows (the last ones) as the test "
                "split")
      ->check(CLI::Range(0.0, 0.99));
  u->add_option("--resize", o->resize,
                "folder: resize every image to HxW (area average to shrink, bilinear to grow); "
                "without it, all images must have the first one's size");
  u->add_flag("--grayscale", o->grayscale,
              "folder: convert colour images to gray (otherwise one colour image makes the "
              "dataset colour, gray images repeated in 3 channels)");
  u->footer(
      "Examples:\n"
      "  kiln upload fashion --train-images train-images-idx3-ubyte.gz \\\n"
      "      --train-labels train-labels-idx1-ubyte.gz \\\n"
      "      --test-images t10k-images-idx3-ubyte.gz --test-labels t10k-labels-idx1-ubyte.gz\n"
      "  kiln upload cifar --format cifar10 --train cifar-10-batches-bin/data_batch_*.bin \\\n"
      "      --test cifar-10-batches-bin/test_batch.bin\n"
      "  kiln upload arrays --format npy --train-images x.npy --train-labels y.npy\n"
      "  kiln upload pets --format folder --train pets/train --test pets/val --resize 64x64\n"
      "  kiln upload iris --format csv --train iris.csv --label-column species --test-fraction "
      "0.2\n"
      "  kiln upload shakespeare --format text input.txt --val-fraction 0.1\n"
      "  kiln upload fineweb --format tokens --train fineweb_train_*.bin \\\n"
      "      --val fineweb_val_000000.bin\n"
      "  kiln submit --preset mnist-cnn --dataset fashion --watch");
  u->callback([&env, action, o] { *action = [&env, o] { return Upload(env, *o); }; });
}

}  // namespace kiln::client
