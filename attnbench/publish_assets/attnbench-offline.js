/* Written by `attnbench publish` (not vendored): lets asv's pages read their data from a file:// page.
 *
 * Browsers refuse XMLHttpRequest on file:// pages, and asv reads every JSON file through $.ajax.
 * Next to each X.json the publish step writes X.json.js, which calls attnbenchOffline(<the data>);
 * on a file:// page this shim answers asv's $.ajax calls for .json files by loading that twin with a
 * <script> tag (allowed on file://). A script's load event fires right after it runs, so the data
 * handed over is the one of the script that just loaded. Served over http(s), nothing changes.
 */
(function ($) {
    "use strict";
    if (window.location.protocol !== "file:") {
        return;
    }
    var handed = [];
    window.attnbenchOffline = function (data) {
        handed.push(data);
    };
    var original = $.ajax;
    $.ajax = function (url, options) {
        var settings = typeof url === "object" ? url : $.extend({}, options, {url: url});
        var path = String(settings.url || "").split("?")[0];
        var dfd = $.Deferred();
        if (/(^|\/)swallow\.ico$/.test(path)) {
            /* asv's "is the server still up" probe after graphs failed: files are always "up" */
            setTimeout(function () { dfd.resolve("", "success"); }, 0);
            return dfd.promise();
        }
        if (!/\.json$/.test(path)) {
            return original.apply(this, arguments);
        }
        var script = document.createElement("script");
        script.src = path + ".js";
        script.onload = function () {
            script.parentNode.removeChild(script);
            if (handed.length) {
                dfd.resolve(handed.pop(), "success");
            } else {
                dfd.reject(null, "error", path + ".js handed no data");
            }
        };
        script.onerror = function () {
            script.parentNode.removeChild(script);
            dfd.reject(null, "error", path + ".js not found");
        };
        document.head.appendChild(script);
        return dfd.promise();
    };
})(jQuery);
